#ifndef FCM_WORKER_CSYSTEM_H
#define FCM_WORKER_CSYSTEM_H

#include <poll.h>
#include <time.h>

/// poll(2) with a timeout to the nanosecond (ppoll(2), which Swift's Glibc module does not
/// declare): `timeout` NULL waits indefinitely.
int fcm_ppoll(struct pollfd *fds, nfds_t count, const struct timespec *timeout);

#endif
