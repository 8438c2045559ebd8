import FCM
import Foundation
import Handlers
import Runtime
import Simulator
import Testing
import Transport
import Worker
import XMPP

/// A simulator with a fresh CA, and client settings that trust it.
struct TestCCS {
    static let senderID = "123456789012"
    static let serverKey = "test-server-key"

    let authority: CertificateAuthority
    let simulator: CCSSimulator

    /// `authority`: the CA of an earlier simulator (one the worker already trusts).
    init(identity: ((CertificateAuthority) throws -> TLSIdentity)? = nil, authority: CertificateAuthority? = nil,
         configure: (inout SimulatorConfiguration) -> Void = { _ in }) throws {
        self.authority = try authority ?? CertificateAuthority()
        let serverIdentity = try identity?(self.authority) ?? self.authority.issueServerIdentity()
        var configuration = SimulatorConfiguration(senderID: Self.senderID, serverKey: Self.serverKey, identity: serverIdentity)
        configure(&configuration)
        simulator = try CCSSimulator(configuration: configuration)
    }

    /// Client settings for this simulator (host 127.0.0.1 unless given).
    func client(host: String = "127.0.0.1", serverKey: String = TestCCS.serverKey,
                trust: TLSTrust? = nil) -> XMPPClientConfiguration {
        var configuration = XMPPClientConfiguration(
            host: host, port: simulator.port,
            credentials: .init(domain: "gcm.googleapis.com", authenticationIdentity: "\(Self.senderID)@gcm.googleapis.com", password: serverKey),
            trust: trust ?? .caPEM(authority.rootCertificatePEM))
        configuration.negotiationTimeout = .seconds(10)
        return configuration
    }

    /// Worker settings for this simulator and `database`, with the CA written to a file and
    /// a spool file of its own.
    func worker(serverKey: String = TestCCS.serverKey, database: TestDatabase) throws -> WorkerConfiguration {
        let caPath = FileManager.default.temporaryDirectory.appendingPathComponent("ca-\(UUID()).pem").path
        try authority.rootCertificatePEM.write(toFile: caPath, atomically: true, encoding: .utf8)
        var configuration = WorkerConfiguration(senderID: Self.senderID, serverKey: serverKey)
        configuration.host = "127.0.0.1"
        configuration.port = simulator.port
        configuration.caFile = caPath
        configuration.databaseURL = database.url
        configuration.spoolFile = FileManager.default.temporaryDirectory.appendingPathComponent("spool-\(UUID()).jsonl").path
        configuration.shutdownTimeout = .seconds(5)
        return configuration
    }

    /// Connects a client and returns it with the id of its session on the simulator.
    func connect(_ configuration: XMPPClientConfiguration? = nil) async throws -> (XMPPConnection<XMLElement>, Int) {
        let before = Set(simulator.boundSessions)
        let connection = try await XMPPConnection<XMLElement>.connect(configuration ?? client())
        try await simulator.wait(for: "the session to be bound") { !Set($0.openBoundSessions).subtracting(before).isEmpty }
        let session = Set(simulator.boundSessions).subtracting(before).min()!
        return (connection, session)
    }
}


/// Starts a worker (quiet logger) with `handlers` (default: `store`); returns its task
/// (cancelling it stops the worker at once) and the events it reports.
func startWorker(_ configuration: WorkerConfiguration, handlers: UpstreamHandlers? = nil) -> (Task<Void, any Error>, WorkerEvents) {
    let (_, task, events) = launchWorker(configuration, handlers: handlers)
    return (task, events)
}

/// `startWorker`, with the worker too: `worker.requestShutdown()` shuts it down gracefully.
func launchWorker(_ configuration: WorkerConfiguration, handlers: UpstreamHandlers? = nil)
    -> (worker: FCMWorker, task: Task<Void, any Error>, events: WorkerEvents) {
    let events = WorkerEvents()
    var chosen = UpstreamHandlers()
    if let handlers { chosen = handlers } else { chosen.register("store", StoreHandler()) }
    let worker = FCMWorker(configuration: configuration, handlers: chosen,
                           logger: Logger(label: "test", minimumLevel: .debug) { TestLog.record($0) }, observer: { events.record($0) })
    return (worker, Task { try await worker.run() }, events)
}

/// Collects worker events for assertions and lets a test wait on them.
final class WorkerEvents: Sendable {
    private let state = BlockingLock<[WorkerEvent]>([])
    var all: [WorkerEvent] { state.withLock { $0 } }
    func record(_ event: WorkerEvent) { state.withLock { $0.append(event) } }

    /// Polls the collected events until `predicate` holds (worker events have no waiters).
    func wait(for what: String, timeout: Duration = .seconds(30), until predicate: ([WorkerEvent]) -> Bool) async throws {
        let deadline = ContinuousClock.now + timeout
        while !predicate(all) {
            guard ContinuousClock.now < deadline else { throw SimulatorError("timed out waiting for \(what): \(all)") }
            try await Task.sleep(for: .milliseconds(10))
        }
    }
}

import Synchronization

extension Array where Element == SimulatorEvent {
    var acked: [String] { compactMap { if case .upstreamAcked(_, let id, _) = $0 { id } else { nil } } }
    var violations: [ProtocolViolation] { compactMap { if case .violation(_, let v) = $0 { v } else { nil } } }
    func count(_ predicate: (SimulatorEvent) -> Bool) -> Int { filter(predicate).count }
}

/// A worker running the `store` handler whose log lines are kept (and go to the sweep), with
/// the worker itself (for `metricsPage`, `requestShutdown`, `reloadCredentials`).
func launchLoggedWorker(_ configuration: WorkerConfiguration) -> (FCMWorker, Task<Void, any Error>, BlockingLock<[String]>) {
    let lines = BlockingLock<[String]>([])
    var handlers = UpstreamHandlers()
    handlers.register("store", StoreHandler())
    let worker = FCMWorker(configuration: configuration, handlers: handlers,
                           logger: Logger(label: "test", minimumLevel: .info) { line in
                               TestLog.record(line)
                               lines.withLock { $0.append(line) }
                           })
    return (worker, Task { try await worker.run() }, lines)
}
