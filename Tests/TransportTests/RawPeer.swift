import Foundation
import TestSupport
#if canImport(Glibc)
import Glibc
#endif

/// A test's raw TCP peer on loopback: bytes written as given, read as they come, and the
/// HTTP/2 frames an attacker would write by hand. Closed when freed.
/// `@unchecked Sendable`: a test may write from one thread while it reads on another; only
/// the reads touch `pending`.
final class RawPeer: @unchecked Sendable {
    let fd: Int32

    /// Connects to 127.0.0.1:`port`; reads time out after `receiveTimeout`.
    init(port: Int, receiveTimeout: Int = 10) throws {
        guard let fd = connectedLoopbackSocket(port: port, receiveTimeout: receiveTimeout) else {
            throw RawPeerError("cannot connect to 127.0.0.1:\(port): \(String(cString: strerror(errno)))")
        }
        self.fd = fd
    }

    deinit { close(fd) }

    /// Writes all of `bytes` (blocking).
    func write(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard written > 0 else { throw RawPeerError("send: \(String(cString: strerror(errno)))") }
            offset += written
        }
    }

    func write(_ text: String) throws { try write(Array(text.utf8)) }

    /// What one read returns: empty at the end of the stream, nil on a timeout or error.
    func read() -> [UInt8]? {
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        return count < 0 ? nil : Array(buffer[..<count])
    }

    /// Writes `chunk` again and again without reading, until the peer stops taking bytes
    /// for `stall` or `limit` bytes went out; returns how many went out.
    func writeWithoutReading(_ chunk: [UInt8], limit: Int, stall: Duration = .seconds(1)) -> Int {
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        defer { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) }
        var total = 0
        var offset = 0
        while total < limit {
            let written = chunk[offset...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if written > 0 {
                total += written
                offset = (offset + written) % chunk.count
                continue
            }
            guard errno == EAGAIN || errno == EWOULDBLOCK else { return total }
            var descriptor = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
            if poll(&descriptor, 1, Int32(stall.components.seconds * 1000 + stall.components.attoseconds / 1_000_000_000_000_000)) == 0 {
                return total
            }
        }
        return total
    }

    // MARK: - HTTP/2 by hand

    static let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

    struct Frame {
        let type: UInt8
        let flags: UInt8
        let streamID: UInt32
        let payload: [UInt8]
    }

    static func frame(type: UInt8, flags: UInt8 = 0, streamID: UInt32 = 0, _ payload: [UInt8] = []) -> [UInt8] {
        let length = payload.count
        return [UInt8(length >> 16 & 0xFF), UInt8(length >> 8 & 0xFF), UInt8(length & 0xFF), type, flags,
                UInt8(streamID >> 24 & 0x7F), UInt8(streamID >> 16 & 0xFF), UInt8(streamID >> 8 & 0xFF), UInt8(streamID & 0xFF)] + payload
    }

    /// The prior-knowledge opening: the preface and an empty SETTINGS.
    static var h2cOpening: [UInt8] { preface + frame(type: 4) }

    /// HPACK for `GET /` over http with `:authority x`, all from the static table but the
    /// authority's value.
    static let getRoot: [UInt8] = [0x82, 0x86, 0x84, 0x01, 0x01, 0x78]

    private var pending: [UInt8] = []

    /// Reads frames until `until` says stop, or the stream ends or times out; returns them.
    func readFrames(until done: ([Frame]) -> Bool) -> [Frame] {
        var frames: [Frame] = []
        while !done(frames) {
            while pending.count >= 9 {
                let length = Int(pending[0]) << 16 | Int(pending[1]) << 8 | Int(pending[2])
                guard pending.count >= 9 + length else { break }
                let stream = UInt32(pending[5] & 0x7F) << 24 | UInt32(pending[6]) << 16 | UInt32(pending[7]) << 8 | UInt32(pending[8])
                frames.append(Frame(type: pending[3], flags: pending[4], streamID: stream, payload: Array(pending[9..<(9 + length)])))
                pending.removeFirst(9 + length)
            }
            if done(frames) { break }
            guard let bytes = read(), !bytes.isEmpty else { break }
            pending += bytes
        }
        return frames
    }
}

struct RawPeerError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
