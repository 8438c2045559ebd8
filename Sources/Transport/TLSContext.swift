internal import COpenSSL
import Foundation

/// Which certificate authorities a client trusts.
public enum TLSTrust: Sendable, Equatable {
    /// The operating system's trust store.
    case systemDefault
    /// The PEM certificates in this file (`--ca-file`).
    case caFile(String)
    /// The PEM certificates in this string (tests, the simulator's generated CA).
    case caPEM(String)
}

extension TLSTrust {
    /// Checks, without connecting, that `path` is a readable file of PEM certificates
    /// OpenSSL can read (at least one), so that a bad `--ca-file` is refused at start.
    /// - Throws: `TransportError.certificateRejected` saying what is wrong with the file.
    public static func checkCAFile(_ path: String) throws(TransportError) {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw .certificateRejected("the CA file \(path) does not exist or is not readable")
        }
        guard let pem = String(data: data, encoding: .utf8) else {
            throw .certificateRejected("the CA file \(path) is not PEM text")
        }
        do {
            let certificates = try PEM.certificates(pem)
            certificates.forEach { X509_free($0) }
        } catch {
            throw .certificateRejected("the CA file \(path) holds no PEM certificate OpenSSL can read")
        }
    }
}

/// A server's certificate chain and private key, PEM-encoded.
public struct TLSIdentity: Sendable {
    public var certificateChainPEM: String
    public var privateKeyPEM: String

    public init(certificateChainPEM: String, privateKeyPEM: String) {
        self.certificateChainPEM = certificateChainPEM
        self.privateKeyPEM = privateKeyPEM
    }
}

/// A configured OpenSSL `SSL_CTX` (TLS 1.2 or newer). Shared by many connections: after
/// configuration it is only used to create per-connection `SSL` objects, which OpenSSL
/// allows from any thread.
public final class TLSContext: @unchecked Sendable {
    package let context: OpaquePointer
    /// True for contexts that verify the peer (clients).
    let isClient: Bool

    private init(method: OpaquePointer, isClient: Bool) throws(TransportError) {
        Self.initializeForProcess()
        guard let context = SSL_CTX_new(method) else {
            throw .tlsFailed("SSL_CTX_new failed: \(OpenSSLErrors.drain())")
        }
        self.context = context
        self.isClient = isClient
        _ = shim_SSL_CTX_set_min_proto_version(context, shim_TLS1_2_VERSION())
        _ = shim_SSL_CTX_set_mode(context, shim_SSL_MODE_ENABLE_PARTIAL_WRITE() | shim_SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER())
    }

    deinit { SSL_CTX_free(context) }

    /// Initializes OpenSSL for a process that may end while other threads still hold TLS
    /// objects, as a command does when it returns with a connection's thread still freeing
    /// its `SSL` (or libpq its connection): OpenSSL then does not free its global state from
    /// `atexit`, under those threads. Without this, OpenSSL's first user registers that
    /// cleanup (libpq, when it tries TLS with the database), and a command could end in a
    /// double free as it exits (`fcm-worker groups create` did so once in CI; the test
    /// process once as it ended with a worker still closing its connections). Calls after
    /// OpenSSL's first use change nothing, so every entry point of this module that uses
    /// OpenSSL (contexts, keys, digests), the simulator's certificate authority and the
    /// Postgres module's connect (before libpq's) do it first; it costs one check after the
    /// first call.
    public static func initializeForProcess() {
        _ = openSSLInitialized
    }

    /// A client context that verifies the server's chain against `trust` (host names are
    /// checked per connection).
    /// - Parameter protocols: the application protocols offered by ALPN, in order of
    ///   preference (`["h2", "http/1.1"]`); none by default.
    public static func client(trust: TLSTrust, protocols: [String] = []) throws(TransportError) -> TLSContext {
        let tls = try TLSContext(method: TLS_client_method(), isClient: true)
        if !protocols.isEmpty {
            var wire: [UInt8] = []
            for name in protocols where !name.isEmpty && name.utf8.count < 256 {
                wire.append(UInt8(name.utf8.count))
                wire += name.utf8
            }
            // 0 is success for this one.
            guard SSL_CTX_set_alpn_protos(tls.context, wire, UInt32(wire.count)) == 0 else {
                throw .tlsFailed("cannot offer ALPN protocols \(protocols): \(OpenSSLErrors.drain())")
            }
        }
        SSL_CTX_set_verify(tls.context, shim_SSL_VERIFY_PEER(), nil)
        switch trust {
        case .systemDefault:
            guard SSL_CTX_set_default_verify_paths(tls.context) == 1 else {
                throw .tlsFailed("cannot load the system trust store: \(OpenSSLErrors.drain())")
            }
        case .caFile(let path):
            guard FileManager.default.isReadableFile(atPath: path) else {
                throw .certificateRejected("CA file \(path) does not exist or is not readable")
            }
            guard SSL_CTX_load_verify_locations(tls.context, path, nil) == 1 else {
                throw .certificateRejected("CA file \(path) holds no usable PEM certificate: \(OpenSSLErrors.drain())")
            }
        case .caPEM(let pem):
            let certificates = try PEM.certificates(pem)
            defer { certificates.forEach { X509_free($0) } }
            let store = SSL_CTX_get_cert_store(tls.context)
            for certificate in certificates where X509_STORE_add_cert(store, certificate) != 1 {
                throw .tlsFailed("cannot add a CA certificate: \(OpenSSLErrors.drain())")
            }
        }
        return tls
    }

    /// A server context presenting `identity`; with `offersHTTP2`, it picks `h2` (else
    /// `http/1.1`) for clients that offer ALPN.
    public static func server(identity: TLSIdentity, offersHTTP2: Bool = false) throws(TransportError) -> TLSContext {
        let tls = try TLSContext(method: TLS_server_method(), isClient: false)
        // A server holds many idle connections: their read and write buffers (about 34 KB a
        // connection) are freed while empty and taken again when a record comes, as nginx does.
        _ = shim_SSL_CTX_set_mode(tls.context, shim_SSL_MODE_RELEASE_BUFFERS())
        if offersHTTP2 { shim_SSL_CTX_select_h2_or_http11(tls.context) }
        let certificates = try PEM.certificates(identity.certificateChainPEM)
        defer { certificates.forEach { X509_free($0) } }
        guard let leaf = certificates.first, SSL_CTX_use_certificate(tls.context, leaf) == 1 else {
            throw .tlsFailed("unusable server certificate: \(OpenSSLErrors.drain())")
        }
        for intermediate in certificates.dropFirst() {
            // SSL_CTX_add_extra_chain_cert takes ownership; hand it its own reference.
            X509_up_ref(intermediate)
            SSL_CTX_ctrl(tls.context, SSL_CTRL_EXTRA_CHAIN_CERT, 0, UnsafeMutableRawPointer(intermediate))
        }
        let key = try PEM.privateKey(identity.privateKeyPEM)
        defer { EVP_PKEY_free(key) }
        guard SSL_CTX_use_PrivateKey(tls.context, key) == 1, SSL_CTX_check_private_key(tls.context) == 1 else {
            throw .tlsFailed("the private key does not match the certificate: \(OpenSSLErrors.drain())")
        }
        return tls
    }
}

/// PEM decoding into OpenSSL objects (caller frees them).
enum PEM {
    static func certificates(_ pem: String) throws(TransportError) -> [OpaquePointer] {
        var result: [OpaquePointer] = []
        let bio = try memoryBIO(pem)
        defer { BIO_free(bio) }
        while let certificate = PEM_read_bio_X509(bio, nil, nil, nil) {
            result.append(certificate)
        }
        ERR_clear_error()  // the end of input shows up as an error; it is not one
        if result.isEmpty { throw .certificateRejected("no PEM certificate found") }
        return result
    }

    static func privateKey(_ pem: String) throws(TransportError) -> OpaquePointer {
        let bio = try memoryBIO(pem)
        defer { BIO_free(bio) }
        guard let key = PEM_read_bio_PrivateKey(bio, nil, nil, nil) else {
            throw .tlsFailed("no PEM private key found: \(OpenSSLErrors.drain())")
        }
        return key
    }
}

extension PEM {
    /// A memory BIO holding a copy of `text` (the caller frees it).
    static func memoryBIO(_ text: String) throws(TransportError) -> OpaquePointer {
        TLSContext.initializeForProcess()
        guard let bio = BIO_new(BIO_s_mem()) else { throw .tlsFailed("BIO_new failed") }
        let written = text.withCString { BIO_write(bio, $0, Int32(strlen($0))) }
        guard written >= 0 else {
            BIO_free(bio)
            throw .tlsFailed("BIO_write failed")
        }
        return bio
    }
}

/// OpenSSL's thread-local error queue, rendered for messages.
enum OpenSSLErrors {
    /// Takes every queued error off this thread's queue and joins their texts.
    static func drain() -> String {
        var messages: [String] = []
        while true {
            let code = ERR_get_error()
            if code == 0 { break }
            var buffer = [CChar](repeating: 0, count: 256)
            ERR_error_string_n(code, &buffer, buffer.count)
            messages.append(String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        return messages.isEmpty ? "no detail from OpenSSL" : messages.joined(separator: "; ")
    }
}

/// `shim_initialize_openssl_for_process`, called once: later calls of
/// `initializeForProcess` (digests, key checks) cost a load, not OpenSSL's own checks.
private let openSSLInitialized: Void = shim_initialize_openssl_for_process()
