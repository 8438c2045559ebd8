import Foundation
import Synchronization
import Testing
import Transport
#if canImport(Glibc)
import Glibc
#endif

/// The fault proxy the fault tests put between the worker and a server: it must touch only
/// sockets that are its own. The test process runs many tests at once, and a descriptor
/// number the proxy closed is soon another test's socket.
@Suite struct FaultProxyTests {
    /// A cut takes the open connections, then shuts their sockets down. Were a connection
    /// whose forwarding ends in between to close its sockets, the cut would shut down
    /// whatever the process opened meanwhile under those numbers: another test's PostgreSQL
    /// connection fails while connecting ("server closed the connection unexpectedly", and
    /// nothing in the server's log). The cut holds the sockets open until it is done.
    @Test func aCutNeverShutsDownSocketsOpenedAfterAConnectionEnded() throws {
        let target = try LoopbackListener()
        let proxy = try FaultProxy(targetPort: target.port)
        defer { proxy.stop() }
        let client = try LoopbackListener.connect(to: proxy.port)
        let forwarded = try target.accept()
        defer { close(forwarded) }
        try waitBlocking("the proxy forwards the connection") { proxy.openCount == 1 }

        let openedMeanwhile = Mutex<[(Int32, Int32)]>([])
        let ended = Mutex<Bool>(false)
        proxy.whenCutTookConnections {
            // The client hangs up: the proxy's forwarding of this connection ends.
            close(client)
            let gone = (try? waitBlocking("the forwarding ends") { proxy.openCount == 0 }) != nil
            ended.withLock { $0 = gone }
            // New sockets get the lowest free numbers: those the ended connection had, had
            // it closed them.
            openedMeanwhile.withLock { pairs in
                for _ in 0..<8 {
                    var ends: [Int32] = [-1, -1]
                    if socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &ends) == 0 { pairs.append((ends[0], ends[1])) }
                }
            }
        }
        proxy.cut()
        let pairs = openedMeanwhile.withLock { $0 }
        defer { for (one, other) in pairs { close(one); close(other) } }
        #expect(ended.withLock { $0 }, "the connection's forwarding did not end")
        #expect(pairs.count == 8)
        for (one, other) in pairs {
            #expect(Self.carriesAByte(from: one, to: other), "socket \(one) → \(other) was shut down by the cut")
            #expect(Self.carriesAByte(from: other, to: one), "socket \(other) → \(one) was shut down by the cut")
        }
    }

    /// Sends one byte on `from` and reads it on `to` within a second.
    private static func carriesAByte(from: Int32, to: Int32) -> Bool {
        var byte: UInt8 = 42
        guard send(from, &byte, 1, Int32(MSG_NOSIGNAL)) == 1 else { return false }
        var descriptor = pollfd(fd: to, events: Int16(POLLIN), revents: 0)
        guard poll(&descriptor, 1, 1000) == 1 else { return false }
        var received: UInt8 = 0
        return recv(to, &received, 1, Int32(MSG_DONTWAIT)) == 1 && received == 42
    }
}

/// Waits on this thread (a few milliseconds between looks) until `condition` holds, or
/// throws after five seconds.
private func waitBlocking(_ what: String, _ condition: () -> Bool) throws {
    let deadline = ContinuousClock.now + .seconds(5)
    while !condition() {
        guard ContinuousClock.now < deadline else { throw ProxyError("timed out waiting: \(what)") }
        usleep(2000)
    }
}

/// A listening TCP socket on 127.0.0.1 and an ephemeral port, for the proxy to forward to.
private final class LoopbackListener {
    let socket: OwnedSocket
    let port: Int

    init() throws {
        let bound = try TCPListener.open(host: "127.0.0.1", port: 0, nonBlocking: false)
        (socket, port) = (OwnedSocket(bound.fd), bound.port)
    }

    /// The next connection (blocking).
    func accept() throws -> Int32 {
        let connection = Glibc.accept(socket.fd, nil, nil)
        guard connection >= 0 else { throw ProxyError("accept: \(String(cString: strerror(errno)))") }
        return connection
    }

    /// A connected socket to 127.0.0.1:`port` (blocking).
    static func connect(to port: Int) throws -> Int32 {
        let fd = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw ProxyError("socket: \(String(cString: strerror(errno)))") }
        var address = loopback(port: port)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else {
            close(fd)
            throw ProxyError("connect: \(String(cString: strerror(errno)))")
        }
        return fd
    }

    private static func loopback(port: Int) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = UInt16(port).bigEndian
        return address
    }
}
