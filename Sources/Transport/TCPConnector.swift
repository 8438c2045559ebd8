import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Runtime

/// Blocking TCP helpers for a connection's own thread: resolve, connect with a deadline,
/// and socket options. Every descriptor returned is non-blocking with TCP_NODELAY set.
package enum TCPConnector {
    /// Resolves `host` (IPv4 and IPv6) and connects to the first address that answers
    /// before `deadline`.
    package static func connect(host: String, port: Int, deadline: ContinuousClock.Instant) throws(TransportError) -> Int32 {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_protocol = Int32(IPPROTO_TCP)
        var list: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, String(port), &hints, &list)
        guard status == 0, let first = list else {
            throw .resolutionFailed(host: host, reason: String(cString: gai_strerror(status)))
        }
        defer { freeaddrinfo(list) }
        var lastError = "no address"
        var cursor: UnsafeMutablePointer<addrinfo>? = first
        while let info = cursor {
            cursor = info.pointee.ai_next
            let fd = socket(info.pointee.ai_family, info.pointee.ai_socktype, info.pointee.ai_protocol)
            if fd < 0 { lastError = String(cString: strerror(errno)); continue }
            configure(fd)
            var result = Glibc.connect(fd, info.pointee.ai_addr, info.pointee.ai_addrlen)
            if result != 0 && errno == EINPROGRESS {
                switch waitFor(fd, events: Int16(POLLOUT), until: deadline) {
                case .ready:
                    var error: Int32 = 0
                    var length = socklen_t(MemoryLayout<Int32>.size)
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length)
                    result = error == 0 ? 0 : -1
                    if error != 0 { errno = error }
                case .timedOut:
                    close(fd)
                    throw .connectTimedOut(host: host, port: port)
                }
            }
            if result == 0 { return fd }
            lastError = String(cString: strerror(errno))
            close(fd)
        }
        throw .connectFailed(host: host, port: port, reason: lastError)
    }

    /// Makes `fd` non-blocking, close-on-exec, with Nagle off.
    static func configure(_ fd: Int32) {
        let flags = fcntl(fd, F_GETFL)
        _ = fcntl(fd, F_SETFL, flags | O_NONBLOCK)
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    }

    enum Readiness { case ready, timedOut }

    /// Waits until `fd` is ready for `events` or the deadline passes; retries EINTR.
    static func waitFor(_ fd: Int32, events: Int16, until deadline: ContinuousClock.Instant) -> Readiness {
        var descriptor = pollfd(fd: fd, events: events, revents: 0)
        while true {
            let remaining = deadline - .now
            if remaining <= .zero { return .timedOut }
            let result = poll(&descriptor, 1, remaining.pollMilliseconds)
            if result > 0 { return .ready }
            if result == 0 { continue }
            if errno != EINTR { return .ready }  // let the caller's next call report the error
        }
    }
}
