#ifndef FCM_WORKER_CEXPAT_SHIM_H
#define FCM_WORKER_CEXPAT_SHIM_H
#include <expat.h>
#include <dlfcn.h>

/// XML_STATUS_* and XML_TRUE are macros or enum values of a typedef'd int; give Swift plain ints.
static inline int shim_XML_STATUS_ERROR(void) { return XML_STATUS_ERROR; }
static inline int shim_XML_STATUS_OK(void) { return XML_STATUS_OK; }
static inline XML_Bool shim_XML_TRUE(void) { return XML_TRUE; }
static inline XML_Bool shim_XML_FALSE(void) { return XML_FALSE; }

/// Turns expat's reparse deferral off for `parser`, where the library has it (expat 2.6.0,
/// and Debian 12's 2.5.0 since its CVE-2023-52425 update): with it on, expat holds back a
/// token that arrived in pieces until "enough" further bytes come, so a stanza whose last
/// bytes came alone could wait, unparsed, for the next read (a keepalive a minute later).
/// Looked up at run time, so that the same build runs on a library without it. Returns 1
/// when it was turned off, 0 when the library has no such setting (nothing to turn off).
static inline int shim_disable_reparse_deferral(XML_Parser parser) {
    typedef XML_Bool (*Setter)(XML_Parser, XML_Bool);
    Setter setter = (Setter)dlsym(RTLD_DEFAULT, "XML_SetReparseDeferralEnabled");
    if (setter == 0) return 0;
    setter(parser, XML_FALSE);
    return 1;
}
#endif
