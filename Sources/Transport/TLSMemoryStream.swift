internal import COpenSSL

/// One end of a TLS connection whose records go through memory instead of a socket: what
/// the peer sent is handed in with `receive`, what this end writes is taken out with
/// `takeRecords`. The same `TLSContext`, `SSL_read` and `SSL_write` as a `TLSStream`, so
/// that the cost of the TLS layer itself can be measured without sockets, polls or
/// threads (the upstream benchmark's floor phase). Owns its `SSL*` and both memory BIOs,
/// freed in `deinit`; used by one thread at a time.
package final class TLSMemoryStream {
    private let ssl: OpaquePointer
    /// What the peer sent, not yet decrypted (owned by `ssl`).
    private let incoming: OpaquePointer
    /// What this end wrote, encrypted, not yet taken (owned by `ssl`).
    private let outgoing: OpaquePointer

    package init(context: TLSContext, role: TLSRole) throws(TransportError) {
        guard let ssl = SSL_new(context.context) else { throw .tlsFailed("SSL_new failed: \(OpenSSLErrors.drain())") }
        guard let incoming = BIO_new(BIO_s_mem()), let outgoing = BIO_new(BIO_s_mem()) else {
            SSL_free(ssl)
            throw .tlsFailed("BIO_new failed")
        }
        SSL_set_bio(ssl, incoming, outgoing)
        self.ssl = ssl
        self.incoming = incoming
        self.outgoing = outgoing
        TLSStream.configure(ssl, as: role)
    }

    deinit {
        SSL_free(ssl)
    }

    /// Runs the handshake between `client` and `server`, passing each one's records to the other.
    /// - Throws: `TransportError.tlsFailed` (or `.certificateRejected`) when it cannot complete.
    package static func handshake(client: TLSMemoryStream, server: TLSMemoryStream) throws(TransportError) {
        for _ in 0..<16 {
            let clientDone = try client.handshakeStep()
            server.receive(client.takeRecords())
            let serverDone = try server.handshakeStep()
            client.receive(server.takeRecords())
            if clientDone && serverDone && client.outgoingCount == 0 && server.outgoingCount == 0 { return }
        }
        throw .tlsFailed("the in-memory TLS handshake did not complete")
    }

    /// Hands in records the peer sent.
    package func receive(_ records: [UInt8]) {
        records.withUnsafeBytes { receive($0) }
    }

    /// Hands in records the peer sent.
    package func receive(_ records: UnsafeRawBufferPointer) {
        guard let base = records.baseAddress, !records.isEmpty else { return }
        _ = BIO_write(incoming, base, Int32(records.count))
    }

    /// Decrypts into `buffer` what the records handed in hold: the byte count, 0 when
    /// nothing more is there.
    /// - Throws: `TransportError.tlsFailed` when a record cannot be decrypted.
    package func read(into buffer: UnsafeMutableRawBufferPointer) throws(TransportError) -> Int {
        ERR_clear_error()
        let result = SSL_read(ssl, buffer.baseAddress, Int32(buffer.count))
        if result > 0 { return Int(result) }
        switch SSL_get_error(ssl, result) {
        case SSL_ERROR_WANT_READ, SSL_ERROR_ZERO_RETURN: return 0
        default: throw .tlsFailed(OpenSSLErrors.drain())
        }
    }

    /// Encrypts all of `bytes` as records (of at most 16 KiB each), taken out with `takeRecords`.
    /// - Throws: `TransportError.tlsFailed` when OpenSSL refuses.
    package func write(_ bytes: UnsafeRawBufferPointer) throws(TransportError) {
        var offset = 0
        while offset < bytes.count {
            ERR_clear_error()
            let result = SSL_write(ssl, bytes.baseAddress! + offset, Int32(bytes.count - offset))
            guard result > 0 else { throw .tlsFailed(OpenSSLErrors.drain()) }
            offset += Int(result)
        }
    }

    /// The records written since the last call.
    package func takeRecords() -> [UInt8] {
        let count = outgoingCount
        guard count > 0 else { return [] }
        return [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
            initialized = Int(max(0, BIO_read(outgoing, buffer.baseAddress, Int32(count))))
        }
    }

    /// Drops the records written so far (what a socket would have carried away), returning
    /// their byte count.
    @discardableResult
    package func discardRecords() -> Int {
        let count = outgoingCount
        if count > 0 { _ = BIO_ctrl(outgoing, BIO_CTRL_RESET, 0, nil) }
        return count
    }

    private var outgoingCount: Int { Int(BIO_ctrl_pending(outgoing)) }

    /// One step of the handshake: true once it is done on this end.
    private func handshakeStep() throws(TransportError) -> Bool {
        ERR_clear_error()
        let result = SSL_do_handshake(ssl)
        if result == 1 { return true }
        switch SSL_get_error(ssl, result) {
        case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE: return false
        default:
            let verify = SSL_get_verify_result(ssl)
            if verify != X509_V_OK { throw .certificateRejected(String(cString: X509_verify_cert_error_string(verify))) }
            throw .tlsFailed(OpenSSLErrors.drain())
        }
    }
}
