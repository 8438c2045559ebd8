#ifndef FCM_WORKER_CSYSTEM_H
#define FCM_WORKER_CSYSTEM_H

#include <poll.h>
#include <time.h>

/// poll(2) with a timeout to the nanosecond (ppoll(2), which Swift's Glibc module does not
/// declare): `timeout` NULL waits indefinitely.
int fcm_ppoll(struct pollfd *fds, nfds_t count, const struct timespec *timeout);

#include <stddef.h>
#include <stdint.h>

/// libFuzzer's driver, for a program with its own main (fcm-worker-fuzz): defined only
/// when the program is linked with -sanitize=fuzzer.
int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));

#endif
