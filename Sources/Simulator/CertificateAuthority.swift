internal import COpenSSL
import Foundation
import Runtime
import Transport
import XMPP

/// A throwaway certificate authority made in memory at run time (EC P-256, SHA-256), for
/// the simulator's TLS: tests and the demo trust its root and nothing else.
/// `@unchecked Sendable`: its key and root certificate (OpenSSL objects) are made in `init`
/// and never changed; OpenSSL allows signing with them from any thread.
public final class CertificateAuthority: @unchecked Sendable {
    /// Why a certificate could not be made (OpenSSL's reasons).
    public struct GenerationError: Error, CustomStringConvertible {
        public let description: String
    }

    // Immutable after init; OpenSSL objects only read (signing) afterwards, under `issued`'s lock.
    private let key: OpaquePointer
    private let certificate: OpaquePointer
    /// The serial number of the last certificate issued (the root's is 1).
    private let issued = BlockingLock(1)

    /// The root certificate, PEM: what a client passes as its CA (`--ca-file`, `.caPEM`).
    public let rootCertificatePEM: String

    /// Makes a new root named `commonName`, valid for `days`.
    public init(commonName: String = "fcm-worker test CA", days: Int = 30) throws {
        TLSContext.initializeForProcess()
        guard let key = shim_EVP_EC_gen("prime256v1") else { throw Self.failure("EC key generation") }
        self.key = key
        guard let certificate = X509_new() else {
            EVP_PKEY_free(key)
            throw Self.failure("X509_new")
        }
        self.certificate = certificate
        try Self.fill(certificate, subject: commonName, publicKey: key, serial: 1, days: days)
        X509_set_issuer_name(certificate, X509_get_subject_name(certificate))
        try Self.addExtension(certificate, issuer: certificate, nid: NID_basic_constraints, value: "critical,CA:TRUE")
        try Self.addExtension(certificate, issuer: certificate, nid: NID_key_usage, value: "critical,keyCertSign,cRLSign")
        try Self.addExtension(certificate, issuer: certificate, nid: NID_subject_key_identifier, value: "hash")
        guard X509_sign(certificate, key, EVP_sha256()) > 0 else { throw Self.failure("signing the root") }
        rootCertificatePEM = try Self.pem { PEM_write_bio_X509($0, certificate) }
    }

    deinit {
        X509_free(certificate)
        EVP_PKEY_free(key)
    }

    /// Issues a server certificate for `dnsNames` and `ipAddresses`, signed by this root.
    /// The returned identity's chain is the leaf alone (clients hold the root).
    public func issueServerIdentity(commonName: String = "localhost", dnsNames: [String] = ["localhost"],
                                    ipAddresses: [String] = ["127.0.0.1", "::1"], days: Int = 30) throws -> TLSIdentity {
        try issued.withLock { serial in
            serial += 1
            return try issue(serial: serial, commonName: commonName, dnsNames: dnsNames, ipAddresses: ipAddresses, days: days)
        }
    }

    /// The leaf of `issueServerIdentity`, numbered `serial`; called under `issued`'s lock (the
    /// root's key signs it).
    private func issue(serial: Int, commonName: String, dnsNames: [String], ipAddresses: [String], days: Int) throws -> TLSIdentity {
        guard let leafKey = shim_EVP_EC_gen("prime256v1") else { throw Self.failure("EC key generation") }
        defer { EVP_PKEY_free(leafKey) }
        guard let leaf = X509_new() else { throw Self.failure("X509_new") }
        defer { X509_free(leaf) }
        try Self.fill(leaf, subject: commonName, publicKey: leafKey, serial: serial, days: days)
        X509_set_issuer_name(leaf, X509_get_subject_name(certificate))
        let names = dnsNames.map { "DNS:\($0)" } + ipAddresses.map { "IP:\($0)" }
        try Self.addExtension(leaf, issuer: certificate, nid: NID_basic_constraints, value: "critical,CA:FALSE")
        try Self.addExtension(leaf, issuer: certificate, nid: NID_key_usage, value: "critical,digitalSignature,keyEncipherment")
        try Self.addExtension(leaf, issuer: certificate, nid: NID_ext_key_usage, value: "serverAuth")
        if !names.isEmpty {
            try Self.addExtension(leaf, issuer: certificate, nid: NID_subject_alt_name, value: names.joined(separator: ","))
        }
        guard X509_sign(leaf, key, EVP_sha256()) > 0 else { throw Self.failure("signing the leaf") }
        return TLSIdentity(
            certificateChainPEM: try Self.pem { PEM_write_bio_X509($0, leaf) },
            privateKeyPEM: try Self.pem { PEM_write_bio_PrivateKey($0, leafKey, nil, nil, 0, nil, nil) })
    }

    private static func fill(_ certificate: OpaquePointer, subject: String, publicKey: OpaquePointer, serial: Int, days: Int) throws {
        X509_set_version(certificate, 2)
        ASN1_INTEGER_set(X509_get_serialNumber(certificate), serial)
        X509_gmtime_adj(X509_getm_notBefore(certificate), -3600)
        X509_gmtime_adj(X509_getm_notAfter(certificate), days * 86_400)
        X509_set_pubkey(certificate, publicKey)
        let name = X509_get_subject_name(certificate)
        guard X509_NAME_add_entry_by_txt(name, "CN", shim_MBSTRING_ASC(), subject, -1, -1, 0) == 1 else {
            throw failure("setting the subject name")
        }
    }

    private static func addExtension(_ certificate: OpaquePointer, issuer: OpaquePointer, nid: Int32, value: String) throws {
        var context = X509V3_CTX()
        X509V3_set_ctx(&context, issuer, certificate, nil, nil, 0)
        guard let ext = X509V3_EXT_conf_nid(nil, &context, nid, value) else {
            throw failure("extension \(value)")
        }
        defer { X509_EXTENSION_free(ext) }
        guard X509_add_ext(certificate, ext, -1) == 1 else { throw failure("adding extension \(value)") }
    }

    private static func pem(_ write: (OpaquePointer) -> Int32) throws -> String {
        guard let bio = BIO_new(BIO_s_mem()) else { throw failure("BIO_new") }
        defer { BIO_free(bio) }
        guard write(bio) == 1 else { throw failure("PEM encoding") }
        var pointer: UnsafeMutablePointer<CChar>?
        let length = shim_BIO_get_mem_data(bio, &pointer)
        guard let pointer, length > 0 else { throw failure("reading PEM") }
        return String(decoding: UnsafeRawBufferPointer(start: pointer, count: length), as: UTF8.self)
    }

    private static func failure(_ step: String) -> GenerationError {
        var detail = ""
        while case let code = ERR_get_error(), code != 0 {
            var buffer = [CChar](repeating: 0, count: 256)
            ERR_error_string_n(code, &buffer, buffer.count)
            detail += " " + String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        }
        return GenerationError(description: "certificate generation failed at \(step):\(detail)")
    }
}
