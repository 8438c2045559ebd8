#ifndef FCM_WORKER_CLIBPQ_SHIM_H
#define FCM_WORKER_CLIBPQ_SHIM_H
// Only includes headers; libpq exposes no macros that Swift needs wrapped.
#include <libpq-fe.h>
#endif
