import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A TLS connection used with blocking calls and deadlines (HTTPS), on one thread at a
/// time: connect and handshake, write everything, read what is there. Owns its socket and
/// `SSL*` (through `TLSStream`), freed when it is released.
package final class TLSChannel {
    private let stream: TLSStream

    private init(stream: TLSStream) {
        self.stream = stream
    }

    /// Connects to `host:port` and completes the handshake (verifying `host`) before `deadline`.
    package static func connect(host: String, port: Int, context: TLSContext,
                                deadline: ContinuousClock.Instant) throws(TransportError) -> TLSChannel {
        let fd = try TCPConnector.connect(host: host, port: port, deadline: deadline)
        let channel = TLSChannel(stream: try TLSStream(fd: fd, context: context, role: .client(serverName: host)))
        try channel.handshake(until: deadline)
        return channel
    }

    /// Completes the server side of the handshake on an accepted socket (taken over).
    package static func accept(fd: Int32, context: TLSContext, deadline: ContinuousClock.Instant) throws(TransportError) -> TLSChannel {
        TCPConnector.configure(fd)
        let channel = TLSChannel(stream: try TLSStream(fd: fd, context: context, role: .server))
        try channel.handshake(until: deadline)
        return channel
    }

    private func handshake(until deadline: ContinuousClock.Instant) throws(TransportError) {
        while true {
            switch stream.handshake() {
            case .done: return
            case .wantRead: try wait(Int16(POLLIN), until: deadline, doing: "the TLS handshake")
            case .wantWrite: try wait(Int16(POLLOUT), until: deadline, doing: "the TLS handshake")
            case .closedByPeer: throw .connectionLost("the peer closed the connection during the TLS handshake")
            case .failed(let error): throw error
            }
        }
    }

    /// Writes all of `bytes` before `deadline`.
    package func write(_ bytes: [UInt8], until deadline: ContinuousClock.Instant) throws(TransportError) {
        var offset = 0
        while offset < bytes.count {
            let progress = bytes.withUnsafeBytes { buffer in
                stream.write(UnsafeRawBufferPointer(rebasing: buffer[offset...]))
            }
            switch progress {
            case .done(let count): offset += count
            case .wantRead: try wait(Int16(POLLIN), until: deadline, doing: "writing")
            case .wantWrite: try wait(Int16(POLLOUT), until: deadline, doing: "writing")
            case .closedByPeer: throw .connectionLost("the peer closed the connection")
            case .failed(let error): throw error
            }
        }
    }

    /// Reads what is available (waiting for something until `deadline`) into `buffer`;
    /// 0 once the peer has closed the connection.
    package func read(into buffer: inout [UInt8], until deadline: ContinuousClock.Instant) throws(TransportError) -> Int {
        while true {
            let progress = buffer.withUnsafeMutableBytes { stream.read(into: $0) }
            switch progress {
            case .done(let count): return count
            case .wantRead: try wait(Int16(POLLIN), until: deadline, doing: "reading")
            case .wantWrite: try wait(Int16(POLLOUT), until: deadline, doing: "reading")
            case .closedByPeer: return 0
            case .failed(.connectionLost): return 0
            case .failed(let error): throw error
            }
        }
    }

    /// Sends close_notify (best effort); the socket closes when the channel is released.
    package func close() {
        stream.sendCloseNotify()
    }

    /// The socket, for `shutdown(2)` from another thread (which makes a blocked wait end).
    package var fd: Int32 { stream.fd }

    /// True when an idle kept-alive connection can no longer be used: the peer closed it
    /// (or sent something unasked). Checked before a request is written on it.
    package func peerHasClosed() -> Bool {
        var descriptor = pollfd(fd: stream.fd, events: Int16(POLLIN), revents: 0)
        guard poll(&descriptor, 1, 0) > 0 else { return false }
        var scratch = [UInt8](repeating: 0, count: 1024)
        switch scratch.withUnsafeMutableBytes({ stream.read(into: $0) }) {
        case .wantRead, .wantWrite: return false
        case .done, .closedByPeer, .failed: return true
        }
    }

    private func wait(_ events: Int16, until deadline: ContinuousClock.Instant, doing what: String) throws(TransportError) {
        if TCPConnector.waitFor(stream.fd, events: events, until: deadline) == .timedOut {
            throw .timedOut("\(what) took too long")
        }
    }
}
