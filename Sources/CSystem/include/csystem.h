#ifndef FCM_WORKER_CSYSTEM_H
#define FCM_WORKER_CSYSTEM_H

#include <poll.h>
#include <time.h>

/// poll(2) with a timeout to the nanosecond (ppoll(2), which Swift's Glibc module does not
/// declare): `timeout` NULL waits indefinitely.
int fcm_ppoll(struct pollfd *fds, nfds_t count, const struct timespec *timeout);

#include <stddef.h>
#include <stdint.h>

/// An event of `fcm_epoll_wait`: what happened (EPOLLIN, EPOLLOUT, EPOLLHUP, EPOLLERR) and
/// the number it was registered with.
struct fcm_epoll_event {
    uint32_t events;
    uint64_t data;
};

/// epoll(7) and eventfd(2)/timerfd(2), which Swift's Glibc module does not declare; every
/// descriptor close-on-exec and non-blocking.
int fcm_epoll_create(void);
/// `op` 1 add, 2 delete, 3 modify (EPOLL_CTL_*); returns -1 with errno on failure.
int fcm_epoll_ctl(int epoll, int op, int fd, uint32_t events, uint64_t data);
/// Waits up to `timeout_ms` (-1: without end) and returns how many events it filled in.
int fcm_epoll_wait(int epoll, struct fcm_epoll_event *events, int capacity, int timeout_ms);
int fcm_eventfd(void);
/// A CLOCK_MONOTONIC timer descriptor, and arming it to fire once after `nanoseconds` (0 disarms).
int fcm_timerfd(void);
int fcm_timerfd_arm(int timer, int64_t nanoseconds);
/// EPOLLIN, EPOLLOUT, EPOLLHUP, EPOLLERR, EPOLLRDHUP as numbers.
uint32_t fcm_epoll_in(void);
uint32_t fcm_epoll_out(void);
uint32_t fcm_epoll_hup(void);
uint32_t fcm_epoll_err(void);

/// libFuzzer's driver, for a program with its own main (fcm-worker-fuzz): defined only
/// when the program is linked with -sanitize=fuzzer.
int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));

#endif
