import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A listening TCP socket on a numeric address (`127.0.0.1`, `::`, `0.0.0.0`), port 0 for
/// a free one. The caller owns `fd` (closes it).
public struct TCPListener: Sendable {
    public let fd: Int32
    /// The port bound (the one chosen when 0 was asked for).
    public let port: Int

    /// Why listening failed.
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// - Throws: `Failure` for an address that is not numeric or cannot be bound.
    public static func open(host: String, port: Int, nonBlocking: Bool, backlog: Int32 = 512) throws(Failure) -> TCPListener {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST
        var list: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &list) == 0, let info = list else {
            throw Failure(description: "cannot listen on \(host): not a numeric address")
        }
        defer { freeaddrinfo(list) }
        let fd = socket(info.pointee.ai_family, info.pointee.ai_socktype, 0)
        guard fd >= 0 else { throw Failure(description: "socket(): \(String(cString: strerror(errno)))") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        guard bind(fd, info.pointee.ai_addr, info.pointee.ai_addrlen) == 0, Glibc.listen(fd, backlog) == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw Failure(description: "cannot listen on \(host):\(port): \(reason)")
        }
        var address = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { _ = getsockname(fd, $0, &length) }
        }
        // sin_port and sin6_port sit at the same offset.
        let boundPort: UInt16 = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin_port) }
        }
        if nonBlocking { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) }
        return TCPListener(fd: fd, port: Int(boundPort))
    }
}
