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

    /// A certificate for its public half, signed by itself, as Google publishes Firebase
    /// Auth's keys (the simulator's key set).
    public func selfSignedCertificatePEM(commonName: String, days: Int = 30) throws(TransportError) -> String {
        guard let certificate = X509_new() else { throw .tlsFailed("X509_new failed") }
        defer { X509_free(certificate) }
        X509_set_version(certificate, 2)
        ASN1_INTEGER_set(X509_get_serialNumber(certificate), 1)
        X509_gmtime_adj(X509_getm_notBefore(certificate), -3600)
        X509_gmtime_adj(X509_getm_notAfter(certificate), days * 86_400)
        X509_set_pubkey(certificate, key)
        let name = X509_get_subject_name(certificate)
        X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, commonName, -1, -1, 0)
        X509_set_issuer_name(certificate, name)
        guard X509_sign(certificate, key, EVP_sha256()) > 0 else {
            ERR_clear_error()
            throw .tlsFailed("signing the certificate failed")
        }
        let pem = PEM.write { PEM_write_bio_X509($0, certificate) }
        guard !pem.isEmpty else { throw .tlsFailed("writing the certificate failed") }
        return pem
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
/// `@unchecked Sendable`: the key is never changed after `init`, and OpenSSL verifies with it
/// from any thread.
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

    /// Reads the RSA public key of a PEM X.509 certificate (`BEGIN CERTIFICATE`), as
    /// Google publishes Firebase Auth's signing keys.
    public init(certificatePEM pem: String) throws(TransportError) {
        TLSContext.initializeForProcess()
        let bio = try PEM.memoryBIO(pem)
        defer { BIO_free(bio) }
        guard let certificate = PEM_read_bio_X509(bio, nil, nil, nil) else {
            ERR_clear_error()
            throw .tlsFailed("not a PEM certificate")
        }
        defer { X509_free(certificate) }
        guard let key = X509_get_pubkey(certificate) else {
            ERR_clear_error()
            throw .tlsFailed("the certificate holds no public key")
        }
        guard EVP_PKEY_get_base_id(key) == EVP_PKEY_RSA else {
            EVP_PKEY_free(key)
            throw .tlsFailed("the certificate's key is not RSA")
        }
        self.key = key
    }

    /// The RSA key with `modulus` and `exponent` (big-endian bytes: a JWK's `n` and `e`,
    /// decoded), as App Check publishes its keys.
    public init(modulus: [UInt8], exponent: [UInt8]) throws(TransportError) {
        TLSContext.initializeForProcess()
        guard modulus.count >= 128, modulus.count <= 1024, !exponent.isEmpty, exponent.count <= 8 else {
            throw .tlsFailed("not a usable RSA key (a modulus of \(modulus.count) bytes)")
        }
        let der = DER.subjectPublicKeyInfo(modulus: modulus, exponent: exponent)
        let key = der.withUnsafeBufferPointer { buffer -> OpaquePointer? in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            return d2i_PUBKEY(nil, &cursor, buffer.count)
        }
        guard let key else {
            ERR_clear_error()
            throw .tlsFailed("not a usable RSA key")
        }
        self.key = key
    }

    deinit {
        EVP_PKEY_free(key)
    }

    /// The key's modulus and exponent (big-endian), as a JWK writes them.
    public var components: (modulus: [UInt8], exponent: [UInt8]) {
        func number(_ name: String) -> [UInt8] {
            var value: OpaquePointer?
            guard EVP_PKEY_get_bn_param(key, name, &value) == 1, let value else { return [] }
            defer { BN_free(value) }
            var bytes = [UInt8](repeating: 0, count: Int((BN_num_bits(value) + 7) / 8))
            _ = BN_bn2bin(value, &bytes)
            return bytes
        }
        return (number("n"), number("e"))
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

/// The little DER an RSA `SubjectPublicKeyInfo` needs (RFC 3279 §2.3.1, RFC 5280 §4.1).
enum DER {
    static func subjectPublicKeyInfo(modulus: [UInt8], exponent: [UInt8]) -> [UInt8] {
        // rsaEncryption (1.2.840.113549.1.1.1) and a NULL parameter.
        let algorithm = sequence([0x06, 0x09, 0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x01, 0x01, 0x05, 0x00])
        let key = sequence(integer(modulus) + integer(exponent))
        return sequence(algorithm + element(0x03, [0x00] + key))
    }

    private static func integer(_ magnitude: [UInt8]) -> [UInt8] {
        var bytes = Array(magnitude.drop { $0 == 0 })
        if bytes.isEmpty || bytes[0] & 0x80 != 0 { bytes.insert(0, at: 0) }
        return element(0x02, bytes)
    }

    private static func sequence(_ content: [UInt8]) -> [UInt8] { element(0x30, content) }

    private static func element(_ tag: UInt8, _ content: [UInt8]) -> [UInt8] {
        var length: [UInt8]
        if content.count < 0x80 {
            length = [UInt8(content.count)]
        } else {
            var count = content.count
            length = []
            while count > 0 {
                length.insert(UInt8(count & 0xFF), at: 0)
                count >>= 8
            }
            length.insert(0x80 | UInt8(length.count), at: 0)
        }
        return [tag] + length + content
    }
}
