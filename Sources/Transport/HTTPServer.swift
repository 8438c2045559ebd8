import Foundation
import Runtime
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// An HTTP server: a listening socket (`AcceptLoop`, whose thread accepts) and one
/// `HTTPServerConnection` per accepted connection, HTTP/2 or HTTP/1.1, over TLS or plain,
/// served on the process's event loops (`EventLoopGroup.shared`: one thread per core serves
/// them all). The
/// worker's metrics endpoint and HTTPS ingress and the simulators serve through it.
///
/// The TLS identity can be replaced while serving (`replaceTLS`): connections accepted
/// afterwards use the new one, connections already open keep theirs. At most
/// `maximumConnections` are served at once; one accepted past that is closed at once (the
/// client retries, or its load balancer picks another instance; `observer` hears of it, as
/// of every connection refused for want of descriptors), or, with
/// `dropsOldestWhenFull` (the metrics endpoint: a probe must never wait behind idle
/// clients), the oldest open connection is closed for it.
package final class HTTPServer: Sendable {
    package let port: Int
    private let acceptLoop: AcceptLoop
    private let name: String
    private let limits: HTTPServerLimits
    private let maximumConnections: Int
    /// A connection for each socket accepted, with its limits and what it runs when it ends.
    private let makeConnection: @Sendable (HTTPServerLimits, HTTPServerObserver, _ onEnd: @escaping @Sendable () -> Void) -> HTTPServerConnection
    private let observer: HTTPServerObserver
    private let tls: BlockingLock<TLSContext?>
    private let connections = BlockingLock<[Int: HTTPReplyMailbox]>([:])
    private let nextConnection = Atomic(0)
    private let refusedConnections = Atomic(0)
    private let draining = Atomic(false)
    private let dropsOldestWhenFull: Bool
    /// Rung as each connection ends (`waitUntilClosed`).
    private let connectionEnded = Doorbell()

    /// Listens on `host:port` (0: a free port) and serves once `start` is called, handing
    /// `batchHandler` the requests of each read of a connection together.
    /// - Parameter tls: nil serves plain HTTP (HTTP/1.1, or HTTP/2 with prior knowledge).
    /// - Throws: `TransportError.connectFailed` when the address cannot be listened on.
    package convenience init(host: String, port: Int, tls: TLSContext?, name: String, limits: HTTPServerLimits = HTTPServerLimits(),
                             maximumConnections: Int = 1024, dropsOldestWhenFull: Bool = false, observer: HTTPServerObserver = HTTPServerObserver(),
                             batchHandler: @escaping HTTPServerConnection.BatchHandler) throws(TransportError) {
        try self.init(host: host, port: port, tls: tls, name: name, limits: limits, maximumConnections: maximumConnections,
                      dropsOldestWhenFull: dropsOldestWhenFull, observer: observer) { limits, observer, onEnd in
            HTTPServerConnection(limits: limits, observer: observer, onEnd: onEnd, batchHandler: batchHandler)
        }
    }

    private init(host: String, port: Int, tls: TLSContext?, name: String, limits: HTTPServerLimits, maximumConnections: Int,
                 dropsOldestWhenFull: Bool, observer: HTTPServerObserver,
                 makeConnection: @escaping @Sendable (HTTPServerLimits, HTTPServerObserver, _ onEnd: @escaping @Sendable () -> Void)
                    -> HTTPServerConnection)
        throws(TransportError) {
        self.dropsOldestWhenFull = dropsOldestWhenFull
        self.observer = observer
        acceptLoop = try AcceptLoop(host: host, port: port)
        self.port = acceptLoop.port
        self.name = name
        self.limits = limits
        self.maximumConnections = maximumConnections
        self.makeConnection = makeConnection
        self.tls = BlockingLock(tls)
    }

    /// Listens on `host:port` (0: a free port) and serves once `start` is called, handing
    /// `handler` each request as soon as it is parsed.
    /// - Throws: `TransportError.connectFailed` when the address cannot be listened on.
    package convenience init(host: String, port: Int, tls: TLSContext?, name: String, limits: HTTPServerLimits = HTTPServerLimits(),
                             maximumConnections: Int = 1024, dropsOldestWhenFull: Bool = false, observer: HTTPServerObserver = HTTPServerObserver(),
                             handler: @escaping HTTPServerConnection.Handler) throws(TransportError) {
        try self.init(host: host, port: port, tls: tls, name: name, limits: limits, maximumConnections: maximumConnections,
                      dropsOldestWhenFull: dropsOldestWhenFull, observer: observer) { limits, observer, onEnd in
            HTTPServerConnection(limits: limits, observer: observer, onEnd: onEnd, handler: handler)
        }
    }

    /// Starts accepting.
    package func start() {
        acceptLoop.start(name: "\(name) accept", accept: { [self] fd in accept(fd) },
                         failed: { [observer] _ in observer.refusedConnection("descriptors") })
    }

    /// Connections accepted past `maximumConnections` and closed at once, so far.
    package var refusedCount: Int { refusedConnections.load(ordering: .relaxed) }

    /// Connections being served now.
    package var openCount: Int { connections.withLock { $0.count } }

    /// True while a connection accepted now would be refused for want of a slot.
    package var isFull: Bool { !dropsOldestWhenFull && openCount >= maximumConnections }

    /// Serves connections accepted from now on with `context`.
    package func replaceTLS(_ context: TLSContext) {
        tls.withLock { $0 = context }
    }

    /// Stops accepting and closes every connection at once.
    package func stop() {
        draining.store(true, ordering: .relaxed)
        acceptLoop.stop()
        for mailbox in connections.withLock({ Array($0.values) }) { mailbox.abort() }
    }

    /// Stops accepting (the port is free when it returns) and asks every open connection to
    /// finish the requests under way and close (HTTP/2: GOAWAY; HTTP/1.1: `Connection:
    /// close` on the answer under way). Answers given later still go out until the
    /// connection closes.
    package func drain() {
        draining.store(true, ordering: .relaxed)
        acceptLoop.stop()
        for mailbox in connections.withLock({ Array($0.values) }) { mailbox.requestGoAway() }
    }

    /// Waits (up to `timeout`, or until the task is cancelled) until every connection has closed.
    package func waitUntilClosed(timeout: Duration) async {
        let deadline = ContinuousClock.now + timeout
        while openCount > 0 && ContinuousClock.now < deadline && !Task.isCancelled {
            await connectionEnded.wait(timeout: deadline - .now)
        }
    }

    private func accept(_ fd: Int32) {
        let id = nextConnection.add(1, ordering: .relaxed).newValue
        if openCount >= maximumConnections && dropsOldestWhenFull {
            let oldest = connections.withLock { open -> HTTPReplyMailbox? in
                guard let first = open.keys.min() else { return nil }
                return open.removeValue(forKey: first)
            }
            oldest?.abort()
        }
        guard openCount < maximumConnections, !draining.load(ordering: .relaxed) else {
            refusedConnections.add(1, ordering: .relaxed)
            observer.refusedConnection(draining.load(ordering: .relaxed) ? "draining" : "full")
            close(fd)
            return
        }
        // Only this thread adds connections, so the count cannot pass the limit meanwhile.
        let connection = makeConnection(limits, observer) { [weak self] in
            self?.connections.withLock { _ = $0.removeValue(forKey: id) }
            self?.connectionEnded.ring()
        }
        do {
            try connection.serve(fd: fd, context: tls.withLock { $0 }, name: "\(name) connection", on: EventLoopGroup.shared.nextLoop(),
                                 register: { mailbox in connections.withLock { $0[id] = mailbox } })
        } catch {
            // Out of descriptors for its loop: refused, never a crash (the client retries).
            refusedConnections.add(1, ordering: .relaxed)
            observer.refusedConnection("descriptors")
            close(fd)
        }
    }
}
