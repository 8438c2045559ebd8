import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A socket descriptor that test servers and proxies own, closed when its last reference
/// goes. Whoever holds one can shut it down from another thread without racing the thread
/// that finishes with it: the number cannot have been closed, and given to another socket
/// of the test process, while a reference remains.
final class OwnedSocket: Sendable {
    let fd: Int32

    init(_ fd: Int32) { self.fd = fd }

    deinit { if fd >= 0 { close(fd) } }

    /// Ends the connection both ways (a blocked `accept`, `read` or `poll` on it returns).
    func shutDown() { _ = shutdown(fd, Int32(SHUT_RDWR)) }
}
