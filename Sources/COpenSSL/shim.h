#ifndef FCM_WORKER_COPENSSL_SHIM_H
#define FCM_WORKER_COPENSSL_SHIM_H
#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <openssl/x509_vfy.h>
#include <openssl/pem.h>
#include <openssl/evp.h>
#include <openssl/ec.h>
#include <openssl/bio.h>
#include <openssl/rand.h>

// Macros (and variadic functions) that Swift cannot call, wrapped as static inline functions.

static inline long shim_SSL_CTX_set_min_proto_version(SSL_CTX *ctx, int version) {
    return SSL_CTX_set_min_proto_version(ctx, version);
}
static inline int shim_TLS1_2_VERSION(void) { return TLS1_2_VERSION; }
static inline long shim_SSL_set_tlsext_host_name(SSL *ssl, const char *name) {
    return SSL_set_tlsext_host_name(ssl, name);
}
static inline long shim_SSL_CTX_set_mode(SSL_CTX *ctx, long mode) { return SSL_CTX_set_mode(ctx, mode); }
static inline long shim_SSL_MODE_ENABLE_PARTIAL_WRITE(void) { return SSL_MODE_ENABLE_PARTIAL_WRITE; }
static inline long shim_SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER(void) { return SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER; }
static inline long shim_BIO_get_mem_data(BIO *bio, char **data) { return BIO_get_mem_data(bio, data); }
static inline EVP_PKEY *shim_EVP_EC_gen(const char *curve) { return EVP_EC_gen(curve); }
static inline int shim_SSL_VERIFY_PEER(void) { return SSL_VERIFY_PEER; }
static inline int shim_SSL_VERIFY_NONE(void) { return SSL_VERIFY_NONE; }
static inline int shim_SSL_FILETYPE_PEM(void) { return SSL_FILETYPE_PEM; }
static inline int shim_MBSTRING_ASC(void) { return MBSTRING_ASC; }
#endif
