import Foundation
import Postgres
import Runtime
import Simulator
import Synchronization
import Worker

/// The downstream benchmark of issue 4: rows inserted into the outbox, sent by an
/// in-process worker to a simulator process that acks each after a set delay.
///
/// Per run (connections × simulated round trip) it prints: sent msgs/s, acked msgs/s, the
/// ack round trip p50/p99 as the worker recorded it (`acked_at - sent_at`), and the share
/// of the flow-control bound (connections × 100 / round trip) reached.
struct DownstreamBench {
    struct Run: CustomStringConvertible, Sendable {
        let connections: Int
        let roundTripMilliseconds: Int
        var bound: Double { Double(connections * 100) / (Double(roundTripMilliseconds) / 1000) }
        var description: String { "\(connections) connection(s) at \(roundTripMilliseconds) ms" }

        /// `16@20`: connections @ milliseconds.
        init?(_ text: Substring) {
            let parts = text.split(separator: "@")
            guard parts.count == 2, let connections = Int(parts[0]), (1...1000).contains(connections),
                  let milliseconds = Int(parts[1]), (1...10_000).contains(milliseconds) else { return nil }
            self.connections = connections
            self.roundTripMilliseconds = milliseconds
        }
    }

    let databaseURL: String
    let runs: [Run]
    /// Each run sends about this many seconds' worth of its bound.
    let seconds: Int

    func run() async throws {
        say("fcm-worker bench downstream: \(runs.count) run(s) of about \(seconds) s, "
              + "\(ProcessInfo.processInfo.activeProcessorCount) cores; simulator in its own process, TLS on loopback")
        try await BenchDatabase.withSchema(in: databaseURL) { url in
            for run in runs { try await report(run, url: url) }
        }
        say("peak RSS of the worker process: \(BenchDatabase.peakResidentMegabytes()) MB")
    }

    private func report(_ run: Run, url: String) async throws {
        let messages = max(5_000, min(500_000, Int(run.bound) * seconds))
        let result = try await measure(run, messages: messages, url: url)
        say(String(format: "%@: %d messages, sent %.0f msgs/s, acked %.0f msgs/s = %.0f%% of the bound %.0f msgs/s; "
                           + "ack round trip p50 %.1f ms, p99 %.1f ms",
                   run.description, messages, result.sentPerSecond, result.ackedPerSecond,
                   100 * result.ackedPerSecond / run.bound, run.bound, result.p50 * 1000, result.p99 * 1000))
        say("  " + result.cpu)
    }

    struct Result {
        var sentPerSecond: Double
        var ackedPerSecond: Double
        var p50: Double
        var p99: Double
        /// Where the CPU went, per message.
        var cpu: String
    }

    private func measure(_ run: Run, messages: Int, url: String) async throws -> Result {
        let connection = try await PostgresConnection.connect(url)
        defer { Task { await connection.close() } }
        try await connection.execute("TRUNCATE downstream_messages, device_tokens")
        try await connection.execute("CHECKPOINT")

        let simulator = try await SimulatorProcess.start(arguments: ["--ack-delay", "\(run.roundTripMilliseconds)", "--quiet"])
        defer { simulator.stop() }
        var configuration = try WorkerConfiguration.parse(arguments: [], environment: simulator.environment)
        configuration.databaseURL = url
        configuration.connections = run.connections
        configuration.spoolFile = simulator.directory + "/spool"
        let connected = Atomic<Int>(0)
        let worker = FCMWorker(configuration: configuration, handlers: UpstreamHandlers(),
                               logger: Logger(label: "bench", minimumLevel: .error), observer: { event in
                                   if case .connected = event { connected.add(1, ordering: .relaxed) }
                               })
        let task = Task { try await worker.run() }
        defer { task.cancel() }
        let deadline = ContinuousClock.now + .seconds(30)
        while connected.load(ordering: .relaxed) < run.connections {
            guard ContinuousClock.now < deadline else { throw SimulatorError("the worker did not connect \(run.connections) time(s)") }
            try await Task.sleep(for: .milliseconds(10))
        }

        let cpu = await CPUAccount.locate(databaseURL: url)
        // One statement, so the rows appear at once; the worker is woken by its NOTIFY. The
        // statistics are refreshed at once, as autovacuum would within a minute: without
        // them the planner reads and sorts every due row for each claim (a new table's
        // first burst), which is not the steady state this measures.
        _ = try await connection.pipeline([
            PostgresStatement("BEGIN"),
            PostgresStatement("""
                INSERT INTO downstream_messages (target, payload)
                SELECT 'bench-token-' || (g % 10000), '{"data":{"text":"benchmark payload"},"priority":"high"}'::jsonb
                FROM generate_series(1, $1) AS g
                """, [.int(Int64(messages))]),
            PostgresStatement("ANALYZE downstream_messages"),
            PostgresStatement("COMMIT"),
        ])
        // From here: the sending (the rows' insert is the application's cost, not the sender's).
        let before = cpu.sample(liveChild: simulator.processIdentifier)
        let limit = ContinuousClock.now + .seconds(Int64(messages / 1000 + 120))
        while true {
            // An index probe, not a count: polling must not weigh on the database it measures.
            let unfinished = try await connection.query("SELECT 1 FROM downstream_messages WHERE available_at IS NOT NULL LIMIT 1")
            if unfinished.isEmpty { break }
            guard ContinuousClock.now < limit else { throw SimulatorError("the outbox was not sent in time") }
            try await Task.sleep(for: .milliseconds(200))
        }
        let after = cpu.sample(liveChild: simulator.processIdentifier)
        task.cancel()
        _ = try? await task.value

        let row = try await connection.query("""
            SELECT count(*) FILTER (WHERE status = 'acked'),
                   extract(epoch FROM max(sent_at) - min(sent_at))::float8,
                   extract(epoch FROM max(acked_at) - min(sent_at))::float8,
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM acked_at - sent_at)),
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM acked_at - sent_at))
            FROM downstream_messages
            """).first
        guard let acked = row?.int(0), acked == messages else {
            throw SimulatorError("\(row?.int(0) ?? 0) of \(messages) rows were acked")
        }
        return Result(sentPerSecond: Double(messages) / (row?.double(1) ?? .nan),
                      ackedPerSecond: Double(messages) / (row?.double(2) ?? .nan),
                      p50: row?.double(3) ?? .nan, p99: row?.double(4) ?? .nan,
                      cpu: CPUAccount.describe(from: before, to: after, messages: messages,
                                               cores: ProcessInfo.processInfo.activeProcessorCount))
    }
}
