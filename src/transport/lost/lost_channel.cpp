// A connection this image cannot reach (see lost_channel.h).
#include "transport/lost/lost_channel.h"

#include "common/real.h"

namespace rsock {

LostChannel::~LostChannel() {
  if (wait_fd_ >= 0) real().close(wait_fd_);
}

}  // namespace rsock
