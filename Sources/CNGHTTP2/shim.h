#ifndef FCM_WORKER_CNGHTTP2_SHIM_H
#define FCM_WORKER_CNGHTTP2_SHIM_H
#include <nghttp2/nghttp2.h>
#endif
