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
#include <openssl/hmac.h>

/* The project's one OpenSSL initialization: without its atexit cleanup, which would free
   OpenSSL's global state while threads still close connections (a double free as a process
   ends with a TLS stream's or a PostgreSQL connection's thread at work). The first
   initialization in a process decides, so every user of OpenSSL calls this before its first
   use: Transport (contexts, keys, digests) and Postgres (before libpq's connect, which
   initializes OpenSSL itself on its first SSL request). OpenSSL runs it once per process;
   later calls cost one check. */
static inline void shim_initialize_openssl_for_process(void) {
    OPENSSL_init_ssl(OPENSSL_INIT_NO_ATEXIT, NULL);
}

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
static inline long shim_SSL_MODE_RELEASE_BUFFERS(void) { return SSL_MODE_RELEASE_BUFFERS; }
static inline long shim_BIO_get_mem_data(BIO *bio, char **data) { return BIO_get_mem_data(bio, data); }
static inline EVP_PKEY *shim_EVP_EC_gen(const char *curve) { return EVP_EC_gen(curve); }
static inline int shim_SSL_VERIFY_PEER(void) { return SSL_VERIFY_PEER; }
static inline int shim_SSL_VERIFY_NONE(void) { return SSL_VERIFY_NONE; }
static inline int shim_SSL_FILETYPE_PEM(void) { return SSL_FILETYPE_PEM; }
static inline int shim_MBSTRING_ASC(void) { return MBSTRING_ASC; }
static inline EVP_PKEY *shim_EVP_RSA_gen(unsigned int bits) { return EVP_RSA_gen(bits); }

/* ALPN: the protocols a server chooses from, in its order of preference ("h2", then
   "http/1.1"), as a wire-format list. */
static const unsigned char shim_alpn_server_protocols[] = { 2, 'h', '2', 8, 'h', 't', 't', 'p', '/', '1', '.', '1' };
static inline int shim_alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                                   const unsigned char *in, unsigned int inlen, void *arg) {
    (void)ssl; (void)arg;
    if (SSL_select_next_proto((unsigned char **)out, outlen, shim_alpn_server_protocols,
                              sizeof shim_alpn_server_protocols, in, inlen) == OPENSSL_NPN_NEGOTIATED) {
        return SSL_TLSEXT_ERR_OK;
    }
    return SSL_TLSEXT_ERR_NOACK;
}
/* A server context that negotiates h2 or http/1.1 with clients that offer ALPN. */
static inline void shim_SSL_CTX_select_h2_or_http11(SSL_CTX *ctx) {
    SSL_CTX_set_alpn_select_cb(ctx, shim_alpn_select, NULL);
}
#endif
