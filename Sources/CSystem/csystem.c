#define _GNU_SOURCE
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include "csystem.h"

int fcm_epoll_create(void) { return epoll_create1(EPOLL_CLOEXEC); }

int fcm_epoll_ctl(int epoll, int op, int fd, uint32_t events, uint64_t data) {
    struct epoll_event event = { .events = events, .data = { .u64 = data } };
    return epoll_ctl(epoll, op, fd, &event);
}

int fcm_epoll_wait(int epoll, struct fcm_epoll_event *events, int capacity, int timeout_ms) {
    struct epoll_event raw[256];
    if (capacity > 256) capacity = 256;
    int count = epoll_wait(epoll, raw, capacity, timeout_ms);
    for (int index = 0; index < count; index++) {
        events[index].events = raw[index].events;
        events[index].data = raw[index].data.u64;
    }
    return count;
}

int fcm_eventfd(void) { return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK); }

int fcm_timerfd(void) { return timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK); }

int fcm_timerfd_arm(int timer, int64_t nanoseconds) {
    struct itimerspec spec = { 0 };
    if (nanoseconds > 0) {
        spec.it_value.tv_sec = nanoseconds / 1000000000;
        spec.it_value.tv_nsec = nanoseconds % 1000000000;
    }
    return timerfd_settime(timer, 0, &spec, NULL);
}

uint32_t fcm_epoll_in(void) { return EPOLLIN; }
uint32_t fcm_epoll_out(void) { return EPOLLOUT; }
uint32_t fcm_epoll_hup(void) { return EPOLLHUP; }
uint32_t fcm_epoll_err(void) { return EPOLLERR; }

int fcm_ppoll(struct pollfd *fds, nfds_t count, const struct timespec *timeout) {
    return ppoll(fds, count, timeout, NULL);
}
