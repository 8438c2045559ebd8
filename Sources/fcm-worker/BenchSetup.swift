import Benchmarks
import FCM
import Foundation
import Handlers
import Postgres
import Runtime
import Simulator
import Synchronization
import Transport
import Worker
import XMPP

/// A simulator process and an in-process worker wired together for one benchmark phase.
///
/// The simulator runs as its own process (`fcm-worker simulate --upstream-rate …
/// --exit-when-acked`), so this process's CPU profile and peak RSS are the worker's.
final class BenchSetup: Sendable {
    final class Commits: Sendable {
        private let state = BlockingLock((count: 0, latencies: [UInt32](), firstConnection: ContinuousClock.Instant?.none))
        private let port = BlockingLock<Int?>(nil)
        var ingressPort: Int? { port.withLock { $0 } }
        func serving(_ ingress: Int) { port.withLock { $0 = ingress } }
        var count: Int { state.withLock { $0.count } }
        var latencies: [UInt32] { state.withLock { $0.latencies } }
        var firstConnection: ContinuousClock.Instant? { state.withLock { $0.firstConnection } }
        func connected() { state.withLock { if $0.firstConnection == nil { $0.firstConnection = .now } } }
        func record(_ handled: [(String, Date)]) {
            let now = Date()
            state.withLock { state in
                state.count += handled.count
                for (_, receivedAt) in handled {
                    state.latencies.append(UInt32(clamping: Int(now.timeIntervalSince(receivedAt) * 1_000_000)))
                }
            }
        }
    }

    let committed = Commits()
    private let simulator: SimulatorProcess
    private let task = BlockingLock<Task<Void, any Error>?>(nil)
    private let worker = BlockingLock<FCMWorker?>(nil)

    private init(simulator: SimulatorProcess) {
        self.simulator = simulator
    }

    /// - Parameters:
    ///   - source: `https`: the worker serves its ingress on a free port, and (with
    ///     `postsItself`) the simulator's devices post `messages` to it, `postBatch` a
    ///     request (about 512 messages in flight whatever the batch).
    static func start(url: String, connections: Int, concurrency: Int, mode: WorkerConfiguration.AckMode,
                      messages: Int, rate: Int, directURL: String? = nil, source: UpstreamBench.Source = .ccs,
                      postsItself: Bool = true, postBatch: Int = 1, ingressIdleTimeout: Duration? = nil,
                      plainIngress: Bool = false) async throws -> BenchSetup {
        let ingressPort = source == .https ? try Self.freePort() : 0
        let arguments = source == .ccs
            ? ["--upstream", "\(messages)", "--upstream-rate", "\(rate)", "--exit-when-acked"]
            : postsItself ? ["--post-to", "127.0.0.1:\(ingressPort)", "--post-messages", "\(messages)", "--post-devices", "\(UpstreamBench.httpsDevices)",
                             "--post-in-flight", "\(max(16, 512 / max(1, postBatch)))", "--post-connections", "16", "--post-batch", "\(postBatch)",
                             "--exit-when-posted", "--quiet"]
                          : ["--quiet"]
        let process = try await SimulatorProcess.start(arguments: arguments, capturesOutput: true)
        let setup = BenchSetup(simulator: process)
        let out = process.directory
        let environment = process.environment
        var configuration = try WorkerConfiguration.parse(arguments: [], environment: environment)
        configuration.databaseURL = url
        if let directURL {
            configuration.databasePooler = .transaction
            configuration.databaseDirectURL = directURL
        }
        configuration.connections = connections
        configuration.concurrency = concurrency
        configuration.pipeline.partitions = concurrency
        configuration.ackMode = mode
        configuration.spoolFile = out + "/spool"
        if source == .https {
            var ingress = configuration.ingressSettings
            ingress.address = "127.0.0.1:\(ingressPort)"
            ingress.certificateFile = out + "/ingress-cert.pem"
            ingress.keyFile = out + "/ingress-key.pem"
            ingress.ratePerSecond = 1_000_000
            ingress.rateBurst = 1_000_000
            ingress.maximumStreamsPerConnection = 256
            if plainIngress {
                ingress.plain = true
                ingress.certificateFile = nil
                ingress.keyFile = nil
            }
            if let ingressIdleTimeout {
                ingress.idleTimeout = ingressIdleTimeout
                ingress.maximumConnections = 65_536
            }
            configuration.ingressSettings = ingress
        }
        var handlers = UpstreamHandlers()
        handlers.register("store", StoreHandler())
        let worker = FCMWorker(configuration: configuration, handlers: handlers, logger: Logger(label: "bench", minimumLevel: .error),
                               observer: { [committed = setup.committed] event in
                                   switch event {
                                   case .committed(let handled, _, _): committed.record(handled)
                                   case .connected where source == .ccs: committed.connected()
                                   case .servingIngress(let port) where source == .https: committed.connected(); committed.serving(port)
                                   default: break
                                   }
                               })
        setup.worker.withLock { $0 = worker }
        setup.task.withLock { $0 = Task { try await worker.run() } }
        return setup
    }

    /// The worker's metrics page now.
    var metricsPage: String? { worker.withLock { $0 }?.metricsPage }

    /// Journal mode's flushes so far: how many, their mean time and size (from the metrics page).
    func journalFlushes() -> String? {
        guard let page = worker.withLock({ $0 })?.metricsPage else { return nil }
        var values: [String: Double] = [:]
        for line in page.split(separator: "\n") where line.hasPrefix("fcm_worker_journal_flush_") {
            let parts = line.split(separator: " ")
            if parts.count == 2, let value = Double(parts[1]) { values[String(parts[0])] = value }
        }
        guard let count = values["fcm_worker_journal_flush_seconds_count"], count > 0 else { return nil }
        return String(format: "%.0f flushes, %.2f ms and %.1f messages each on average", count,
                      (values["fcm_worker_journal_flush_seconds_sum"] ?? 0) / count * 1000,
                      (values["fcm_worker_journal_flush_messages_sum"] ?? 0) / count)
    }

    /// The simulator's folder (its CA, tokens, the ingress certificate).
    var directory: String { simulator.directory }

    /// The port of the worker's ingress, once it serves.
    func ingressPort() async throws -> Int {
        let deadline = ContinuousClock.now + .seconds(30)
        while committed.ingressPort == nil {
            guard ContinuousClock.now < deadline else { throw SimulatorError("the worker's ingress did not start") }
            try await Task.sleep(for: .milliseconds(5))
        }
        return committed.ingressPort!
    }

    /// A port free now (the system's choice, released at once).
    static func freePort() throws -> Int {
        let listener = try TCPListener.open(host: "127.0.0.1", port: 0, nonBlocking: false)
        close(listener.fd)
        return listener.port
    }

    /// When the worker's first connection was up.
    func firstConnection() async throws -> ContinuousClock.Instant {
        while committed.firstConnection == nil { try await Task.sleep(for: .milliseconds(1)) }
        return committed.firstConnection!
    }

    /// Waits until the simulator has seen every message acked (it then exits) and returns
    /// when, with its ack-latency summary.
    func waitForAllAcked(limit: Duration) async throws -> (ContinuousClock.Instant, String) {
        let deadline = ContinuousClock.now + limit
        while simulator.isRunning {
            guard ContinuousClock.now < deadline else { throw SimulatorError("not every message was acked within \(limit)") }
            try await Task.sleep(for: .milliseconds(1))
        }
        let ackedAt = ContinuousClock.now
        var line: String?
        for _ in 0..<500 {
            line = simulator.output?.split(separator: "\n").first { $0.hasPrefix("stats ") }.map(String.init)
            if line != nil { break }
            try await Task.sleep(for: .milliseconds(2))
        }
        return (ackedAt, Self.describe(line))
    }

    /// `stats acked=… p50_us=…` as "p50 x ms, p99 …".
    private static func describe(_ line: String?) -> String {
        guard let line else { return "no statistics from the simulator" }
        var values: [String: Double] = [:]
        for field in line.split(separator: " ").dropFirst() {
            let parts = field.split(separator: "=")
            if parts.count == 2, let value = Double(parts[1]) { values[String(parts[0])] = value }
        }
        func ms(_ key: String) -> String { String(format: "%.2f ms", (values[key] ?? .nan) / 1000) }
        return "p50 \(ms("p50_us")), p99 \(ms("p99_us")), p99.9 \(ms("p999_us")), max \(ms("max_us")) (\(Int(values["acked"] ?? 0)) samples)"
    }

    /// Stops the worker gracefully, then the simulator.
    func shutdown() async {
        let task = self.task.withLock { $0 }
        worker.withLock { $0 }?.requestShutdown()
        _ = try? await task?.value
        simulator.stop()
    }

    /// Best-effort stop on error paths.
    func stop() {
        task.withLock { $0 }?.cancel()
        simulator.stop()
    }
}

/// Prints a line at once (standard output may be a file or pipe, where `print` buffers).
func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}
