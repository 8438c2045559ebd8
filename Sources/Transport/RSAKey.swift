internal import COpenSSL
import Foundation

/// An RSA private key (the one owner of its `EVP_PKEY`, freed in `deinit`): signs with
/// RS256 (RSASSA-PKCS1-v1_5 over SHA-256), as Google's service-account JWTs are. The key is
/// not changed after it is made, and each signature uses a context of its own, so one key
/// signs from any thread.
public final class RSAPrivateKey: @unchecked Sendable {
    let key: OpaquePointer

    private init(key: OpaquePointer) {
        self.key = key
    }

    /// Reads a PEM private key (`BEGIN PRIVATE KEY`, PKCS #8, as in a service-account file,
    /// or `BEGIN RSA PRIVATE KEY`).
    /// - Throws: `TransportError.tlsFailed` saying that the text holds no usable RSA key
    ///   (never the key itself).
    public convenience init(pem: String) throws(TransportError) {
        TLSContext.initializeForProcess()
        let key: OpaquePointer
        do {
            key = try PEM.privateKey(pem)
        } catch {
            throw .tlsFailed("the private key is not a PEM key OpenSSL can read")
        }
        guard EVP_PKEY_get_base_id(key) == EVP_PKEY_RSA else {
            EVP_PKEY_free(key)
            throw .tlsFailed("the private key is not an RSA key")
        }
        self.init(key: key)
    }

    /// A new key of `bits` bits (the simulator's service account).
    public static func generate(bits: UInt32 = 2048) throws(TransportError) -> RSAPrivateKey {
        TLSContext.initializeForProcess()
        guard let key = shim_EVP_RSA_gen(bits) else { throw .tlsFailed("cannot make an RSA key: \(OpenSSLErrors.drain())") }
        return RSAPrivateKey(key: key)
    }

    deinit {
        EVP_PKEY_free(key)
    }

    /// The key as PKCS #8 PEM (`BEGIN PRIVATE KEY`).
    public var pkcs8PEM: String {
        PEM.write { bio in PEM_write_bio_PrivateKey(bio, key, nil, nil, 0, nil, nil) }
    }

    /// Its public half as PEM (`BEGIN PUBLIC KEY`).
    public var publicKeyPEM: String {
        PEM.write { bio in PEM_write_bio_PUBKEY(bio, key) }
    }

    /// The RS256 signature of `data`.
    /// - Throws: `TransportError.tlsFailed` when OpenSSL cannot sign.
    public func signSHA256(_ data: [UInt8]) throws(TransportError) -> [UInt8] {
        guard let context = EVP_MD_CTX_new() else { throw .tlsFailed("EVP_MD_CTX_new failed") }
        defer { EVP_MD_CTX_free(context) }
        guard EVP_DigestSignInit(context, nil, EVP_sha256(), nil, key) == 1 else {
            throw .tlsFailed("cannot sign: \(OpenSSLErrors.drain())")
        }
        var length = 0
        guard EVP_DigestSign(context, nil, &length, data, data.count) == 1 else { throw .tlsFailed("cannot sign: \(OpenSSLErrors.drain())") }
        var signature = [UInt8](repeating: 0, count: length)
        guard EVP_DigestSign(context, &signature, &length, data, data.count) == 1 else {
            throw .tlsFailed("cannot sign: \(OpenSSLErrors.drain())")
        }
        return Array(signature.prefix(length))
    }
}

/// An RSA public key (the one owner of its `EVP_PKEY`): checks RS256 signatures.
public final class RSAPublicKey: @unchecked Sendable {
    let key: OpaquePointer

    /// Reads a PEM public key (`BEGIN PUBLIC KEY`).
    public init(pem: String) throws(TransportError) {
        TLSContext.initializeForProcess()
        let bio = try PEM.memoryBIO(pem)
        defer { BIO_free(bio) }
        guard let key = PEM_read_bio_PUBKEY(bio, nil, nil, nil) else {
            ERR_clear_error()
            throw .tlsFailed("not a PEM public key")
        }
        self.key = key
    }

    deinit {
        EVP_PKEY_free(key)
    }

    /// Whether `signature` is the RS256 signature of `data` by this key's private half.
    public func verifySHA256(_ data: [UInt8], signature: [UInt8]) -> Bool {
        guard let context = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(context) }
        guard EVP_DigestVerifyInit(context, nil, EVP_sha256(), nil, key) == 1 else {
            ERR_clear_error()
            return false
        }
        let valid = EVP_DigestVerify(context, signature, signature.count, data, data.count) == 1
        ERR_clear_error()
        return valid
    }
}

/// Base64 with the URL alphabet and no padding (RFC 4648 §5), as JWTs write it.
public enum Base64URL {
    public static func encode(_ bytes: [UInt8]) -> String {
        Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    /// The bytes, or nil for text that is not base64url.
    public static func decode(_ text: String) -> [UInt8]? {
        var standard = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while standard.utf8.count % 4 != 0 { standard += "=" }
        return Data(base64Encoded: standard).map { Array($0) }
    }
}

extension PEM {
    /// What `body` writes to a memory BIO, as text.
    static func write(_ body: (OpaquePointer) -> Int32) -> String {
        guard let bio = BIO_new(BIO_s_mem()) else { return "" }
        defer { BIO_free(bio) }
        guard body(bio) == 1 else { return "" }
        var data: UnsafeMutablePointer<CChar>?
        let length = shim_BIO_get_mem_data(bio, &data)
        guard let data, length > 0 else { return "" }
        return String(decoding: UnsafeRawBufferPointer(start: data, count: length), as: UTF8.self)
    }
}
