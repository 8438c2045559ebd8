#ifndef FCM_WORKER_CEXPAT_SHIM_H
#define FCM_WORKER_CEXPAT_SHIM_H
#include <expat.h>

/// XML_STATUS_* and XML_TRUE are macros or enum values of a typedef'd int; give Swift plain ints.
static inline int shim_XML_STATUS_ERROR(void) { return XML_STATUS_ERROR; }
static inline int shim_XML_STATUS_OK(void) { return XML_STATUS_OK; }
static inline XML_Bool shim_XML_TRUE(void) { return XML_TRUE; }
static inline XML_Bool shim_XML_FALSE(void) { return XML_FALSE; }
#endif
