// Names the calling thread, so that `top -H`, gdb, perf and bench/thread_cpu.py tell the server's threads apart
// (Linux shows the first 15 characters).
#pragma once

#include <pthread.h>

namespace aotc::server {

inline void name_this_thread(const char* name) { pthread_setname_np(pthread_self(), name); }

}  // namespace aotc::server
