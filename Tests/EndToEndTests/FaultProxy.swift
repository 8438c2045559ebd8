import Runtime
import Foundation
import Synchronization
import Transport
import Worker
#if canImport(Glibc)
import Glibc
#endif

/// A TCP proxy on 127.0.0.1 between the worker and a server (PostgreSQL or CCS) that a
/// test controls: it passes bytes, refuses new connections, stalls (holds every byte, in
/// both directions, on the connections open now, while new ones work or not), or cuts
/// every open connection. Each connection is forwarded by a thread of its own.
final class FaultProxy: Sendable {
    enum Mode: Sendable, Equatable {
        /// Forward everything.
        case pass
        /// Close new connections at once (existing ones go on, unless `cut()`).
        case refuse
        /// Stop forwarding on the connections open now; new ones are forwarded when
        /// `newConnectionsWork`, else held too (a partition).
        case stall(newConnectionsWork: Bool)
    }

    private struct State {
        var mode = Mode.pass
        /// Connections whose bytes are held (open when a stall began).
        var stalled: Set<Int> = []
        var open: [Int: (client: OwnedSocket, server: OwnedSocket)] = [:]
        var nextID = 0
        var stopped = false
        var accepted = 0
        /// The listening socket until `stop()` (the accept loop holds it while it runs).
        var listener: OwnedSocket?
        /// Called by `cut()` between taking the open connections and shutting them down.
        var cutTookConnections: (@Sendable () -> Void)?
    }

    let port: Int
    private let targetPort: Int
    private let state = BlockingLock(State())

    init(targetPort: Int) throws {
        self.targetPort = targetPort
        let bound = try TCPListener.open(host: "127.0.0.1", port: 0, nonBlocking: false, backlog: 128)
        let listener = OwnedSocket(bound.fd)
        port = bound.port
        state.withLock { $0.listener = listener }
        Thread.start(named: "fault proxy") { [self] in acceptLoop(on: listener) }
    }

    /// Sets how the proxy behaves from now on. Stalling holds the connections open now.
    func set(_ mode: Mode) {
        state.withLock { state in
            state.mode = mode
            switch mode {
            case .stall: state.stalled.formUnion(state.open.keys)
            case .pass: state.stalled.removeAll()
            case .refuse: break
            }
        }
    }

    /// Closes every open connection at once (both sides see the connection drop).
    ///
    /// The sockets are shut down through the references taken here, which keep them open
    /// until this is done: a connection whose forwarding ends meanwhile closes its sockets
    /// only afterwards, so the shutdown never reaches a descriptor number the process has
    /// given to another socket since (another test's PostgreSQL connection, say).
    func cut() {
        let (open, tookConnections) = state.withLock { state in
            defer { state.stalled.removeAll() }
            return (Array(state.open.values), state.cutTookConnections)
        }
        tookConnections?()
        for (client, server) in open {
            client.shutDown()
            server.shutDown()
        }
    }

    /// Connections accepted so far.
    var acceptedCount: Int { state.withLock { $0.accepted } }

    /// Connections being forwarded now.
    var openCount: Int { state.withLock { $0.open.count } }

    /// Runs `body` in each later `cut()` after it took the open connections and before it
    /// shuts them down (for the proxy's own tests).
    func whenCutTookConnections(_ body: @escaping @Sendable () -> Void) {
        state.withLock { $0.cutTookConnections = body }
    }

    /// Stops accepting and cuts every open connection. The listening socket closes once the
    /// accept loop has let go of it, so that loop never accepts on a reused number.
    func stop() {
        let listener = state.withLock { state -> OwnedSocket? in
            state.stopped = true
            defer { state.listener = nil }
            return state.listener
        }
        listener?.shutDown()
        cut()
    }

    /// A PostgreSQL URL like `url` but through this proxy.
    func url(replacingPortIn url: String) -> String {
        url.replacingOccurrences(of: ":\(targetPort)/", with: ":\(port)/")
    }

    private func acceptLoop(on listener: OwnedSocket) {
        while true {
            let accepted = accept(listener.fd, nil, nil)
            if accepted < 0 {
                if errno == EINTR { continue }
                return
            }
            let client = OwnedSocket(accepted)
            let (mode, stopped) = state.withLock { state -> (Mode, Bool) in
                state.accepted += 1
                return (state.mode, state.stopped)
            }
            if stopped { return }
            if mode == .refuse { continue }
            let server = OwnedSocket(socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0))
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = UInt16(targetPort).bigEndian
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(server.fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard connected == 0 else { continue }
            let id = state.withLock { state -> Int in
                state.nextID += 1
                state.open[state.nextID] = (client, server)
                if case .stall(newConnectionsWork: false) = state.mode { state.stalled.insert(state.nextID) }
                return state.nextID
            }
            Thread.start(named: "fault proxy connection") { [self] in forward(id: id, client: client, server: server) }
        }
    }

    /// Copies bytes both ways until either side closes; while stalled, holds them. The
    /// sockets close when the last of this and a `cut()` under way lets go of them.
    private func forward(id: Int, client clientSocket: OwnedSocket, server serverSocket: OwnedSocket) {
        let (client, server) = (clientSocket.fd, serverSocket.fd)
        defer {
            state.withLock { state in
                state.open[id] = nil
                state.stalled.remove(id)
            }
            withExtendedLifetime((clientSocket, serverSocket)) {}
        }
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            if state.withLock({ $0.stalled.contains(id) }) {
                // Held: read nothing, write nothing (the peers' own buffers fill up), but
                // notice a peer that hangs up (POLLRDHUP), so that the other side sees it too.
                var probe = [pollfd(fd: client, events: Self.peerClosed, revents: 0),
                             pollfd(fd: server, events: Self.peerClosed, revents: 0)]
                _ = poll(&probe, 2, 20)
                if probe.contains(where: { $0.revents & (Self.peerClosed | Int16(POLLHUP | POLLERR | POLLNVAL)) != 0 }) { return }
                continue
            }
            var descriptors = [pollfd(fd: client, events: Int16(POLLIN), revents: 0),
                               pollfd(fd: server, events: Int16(POLLIN), revents: 0)]
            guard poll(&descriptors, 2, 20) >= 0 || errno == EINTR else { return }
            for (index, descriptor) in descriptors.enumerated() where descriptor.revents != 0 {
                if state.withLock({ $0.stalled.contains(id) }) { break }
                let from = index == 0 ? client : server, to = index == 0 ? server : client
                let count = buffer.withUnsafeMutableBytes { read(from, $0.baseAddress, $0.count) }
                if count <= 0 { return }
                var offset = 0
                while offset < count {
                    let written = buffer.withUnsafeBytes { write(to, $0.baseAddress! + offset, count - offset) }
                    if written <= 0 { return }
                    offset += written
                }
            }
        }
    }
}

extension FaultProxy {
    /// POLLRDHUP (Linux): the peer closed its side.
    fileprivate static let peerClosed = Int16(0x2000)
}

struct ProxyError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// A worker configuration (`ccs.worker`) whose database connections go through a new fault
/// proxy, with short database deadlines and retries (tests of database faults).
func proxiedWorker(_ ccs: TestCCS, _ database: TestDatabase) throws -> (WorkerConfiguration, FaultProxy) {
    let base = try TestDatabase.baseURL
    guard let port = URLComponents(string: base)?.port else { throw ProxyError("no port in \(base)") }
    let proxy = try FaultProxy(targetPort: port)
    var configuration = try ccs.worker(database: database)
    configuration.databaseURL = proxy.url(replacingPortIn: database.url)
    configuration.databaseTimeout = .seconds(2)
    configuration.pipeline.databaseRetryBase = .milliseconds(50)
    configuration.pipeline.databaseRetryCap = .milliseconds(500)
    return (configuration, proxy)
}
