internal import COpenSSL
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Which end of a TLS connection this side is.
package enum TLSRole: Sendable {
    /// Verify the server as `serverName` (SNI and host name check; IP literals checked as IPs).
    case client(serverName: String)
    case server
}

/// One connection over a non-blocking socket, TLS or plain (a server port behind a
/// TLS-terminating load balancer): owns the descriptor and the `SSL*` and frees both in
/// `deinit`. Used by one thread only (its stream loop). Plain, every call goes straight to
/// the socket (`recv`/`send`) and the handshake is done at once.
final class TLSStream {
    /// The outcome of a non-blocking TLS call.
    enum Progress {
        case done(Int)
        /// Call again once the socket is readable.
        case wantRead
        /// Call again once the socket is writable.
        case wantWrite
        /// The peer sent close_notify.
        case closedByPeer
        case failed(TransportError)
    }

    let fd: Int32
    /// nil for a plain connection.
    private let ssl: OpaquePointer?
    private let isClient: Bool

    /// Takes ownership of `fd` (closed in `deinit`, even if this initializer throws); a nil
    /// `context` makes a plain connection.
    init(fd: Int32, context: TLSContext?, role: TLSRole) throws(TransportError) {
        guard let context else {
            self.fd = fd
            self.ssl = nil
            if case .client = role { isClient = true } else { isClient = false }
            return
        }
        guard let ssl = SSL_new(context.context) else {
            close(fd)
            throw .tlsFailed("SSL_new failed: \(OpenSSLErrors.drain())")
        }
        self.fd = fd
        self.ssl = ssl
        SSL_set_fd(ssl, fd)
        Self.configure(ssl, as: role)
        if case .client = role { isClient = true } else { isClient = false }
    }

    /// Makes `ssl` the client (SNI and host name check) or the server end of a connection.
    static func configure(_ ssl: OpaquePointer, as role: TLSRole) {
        switch role {
        case .client(let serverName):
            SSL_set_connect_state(ssl)
            if isIPAddress(serverName) {
                X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), serverName)
            } else {
                _ = shim_SSL_set_tlsext_host_name(ssl, serverName)
                SSL_set1_host(ssl, serverName)
            }
        case .server:
            SSL_set_accept_state(ssl)
        }
    }

    deinit {
        if let ssl { SSL_free(ssl) }
        close(fd)
    }

    /// The application protocol ALPN chose (`h2`, `http/1.1`), once the handshake is done;
    /// nil when none was.
    var negotiatedProtocol: String? {
        var data: UnsafePointer<UInt8>?
        var length: UInt32 = 0
        guard let ssl else { return nil }
        SSL_get0_alpn_selected(ssl, &data, &length)
        guard let data, length > 0 else { return nil }
        return String(decoding: UnsafeBufferPointer(start: data, count: Int(length)), as: UTF8.self)
    }

    /// One step of the handshake.
    func handshake() -> Progress {
        guard let ssl else { return .done(0) }
        ERR_clear_error()
        let result = SSL_do_handshake(ssl)
        if result == 1 { return .done(0) }
        switch classify(result) {
        case .failed(let error):
            let verify = SSL_get_verify_result(ssl)
            if isClient && verify != X509_V_OK {
                let reason = String(cString: X509_verify_cert_error_string(verify))
                return .failed(.certificateRejected(reason))
            }
            return .failed(error)
        case let other:
            return other
        }
    }

    /// Reads decrypted bytes into `buffer`.
    func read(into buffer: UnsafeMutableRawBufferPointer) -> Progress {
        guard let ssl else { return Self.plainProgress(recv(fd, buffer.baseAddress, buffer.count, 0), reading: true) }
        ERR_clear_error()
        let result = SSL_read(ssl, buffer.baseAddress, Int32(buffer.count))
        if result > 0 { return .done(Int(result)) }
        return classify(result)
    }

    /// Encrypts and sends up to `bytes.count` bytes as one or more records.
    func write(_ bytes: UnsafeRawBufferPointer) -> Progress {
        guard let ssl else { return Self.plainProgress(send(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL)), reading: false) }
        ERR_clear_error()
        let result = SSL_write(ssl, bytes.baseAddress, Int32(bytes.count))
        if result > 0 { return .done(Int(result)) }
        return classify(result)
    }

    /// Sends close_notify (best effort; does not wait for the peer's).
    func sendCloseNotify(halfClose: Bool = false) {
        guard let ssl else {
            shutdown(fd, Int32(SHUT_WR))
            return
        }
        ERR_clear_error()
        _ = SSL_shutdown(ssl)
        ERR_clear_error()
        // The TCP FIN right after: a peer that reads until the connection ends (an HTTP/1.1
        // client after `Connection: close`) sees it end now, not when this side gives up
        // waiting for its close_notify.
        if halfClose { shutdown(fd, Int32(SHUT_WR)) }
    }

    /// Bytes already decrypted and waiting in OpenSSL's buffer.
    var pendingBytes: Int { ssl.map { Int(SSL_pending($0)) } ?? 0 }

    /// A plain `recv`/`send`'s result as progress (0 from `recv`: the peer closed).
    private static func plainProgress(_ result: Int, reading: Bool) -> Progress {
        if result > 0 { return .done(result) }
        if result == 0 { return reading ? .closedByPeer : .wantWrite }
        switch errno {
        case EAGAIN, EWOULDBLOCK, EINTR: return reading ? .wantRead : .wantWrite
        default: return .failed(.connectionLost(String(cString: strerror(errno))))
        }
    }

    private func classify(_ result: Int32) -> Progress {
        let code = SSL_get_error(ssl, result)
        switch code {
        case SSL_ERROR_WANT_READ: return .wantRead
        case SSL_ERROR_WANT_WRITE: return .wantWrite
        case SSL_ERROR_ZERO_RETURN: return .closedByPeer
        case SSL_ERROR_SYSCALL:
            let savedErrno = errno
            _ = OpenSSLErrors.drain()
            if savedErrno == 0 {
                return .failed(.connectionLost("the peer closed the TCP connection without closing the stream"))
            }
            return .failed(.connectionLost(String(cString: strerror(savedErrno))))
        default:
            let detail = OpenSSLErrors.drain()
            if detail.contains("unexpected eof") {
                return .failed(.connectionLost("the peer closed the TCP connection without closing the stream"))
            }
            return .failed(.tlsFailed(detail))
        }
    }

    private static func isIPAddress(_ host: String) -> Bool {
        var v4 = in_addr(), v6 = in6_addr()
        return inet_pton(AF_INET, host, &v4) == 1 || inet_pton(AF_INET6, host, &v6) == 1
    }
}
