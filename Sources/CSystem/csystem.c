#define _GNU_SOURCE
#include <poll.h>
#include <signal.h>
#include "csystem.h"

int fcm_ppoll(struct pollfd *fds, nfds_t count, const struct timespec *timeout) {
    return ppoll(fds, count, timeout, NULL);
}
