#include "common/quiet_thread.h"

#include <pthread.h>
#include <signal.h>

namespace rsock {

int spawn_quiet_thread(void* (*fn)(void*), void* arg) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  // The new thread inherits the mask in force at pthread_create.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t t;
  const int rc = pthread_create(&t, &attr, fn, arg);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  pthread_attr_destroy(&attr);
  return rc;
}

}  // namespace rsock
