// Resolves the real libc entry points (see real.h).
#include "common/real.h"

#include <dlfcn.h>

namespace rsock {

RealCalls g_real;

void resolve_real_calls() {
  RealCalls r{};
  // A missing symbol stays null; wrappers check before calling through.
#define RSOCK_REAL(ret, name, args) r.name = reinterpret_cast<ret(*) args>(dlsym(RTLD_NEXT, #name));
#include "common/real_list.h"
#undef RSOCK_REAL
  r.resolved = false;
  g_real = r;
  __atomic_store_n(&g_real.resolved, true, __ATOMIC_RELEASE);
}

}  // namespace rsock
