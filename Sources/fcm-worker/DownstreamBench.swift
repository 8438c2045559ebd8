import Benchmarks
import Foundation
import Outbox
import Postgres
import Runtime
import Simulator
import Synchronization
import Worker

/// The downstream benchmark: rows inserted into the outbox, sent by an in-process worker to
/// a simulator process that answers each after a set delay (over XMPP, or over FCM's HTTP v1
/// API with `--transport v1`, each run then paired with XMPP's).
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
    /// Upstream messages stored before the first run and after each, as the references of
    /// the runs' CPU ratios (0: none).
    let referenceMessages: Int
    /// Rows of the HTTP multicast run, each to `multicastTokens` tokens (0: no such run).
    let multicastRows: Int
    let multicastTokens = 1000
    /// Rows of the database-cost runs (`OutboxDatabaseCost`; 0: none).
    let statementRows: Int
    /// `xmpp`, or `v1`: each run sent over FCM's HTTP v1 API, then over XMPP at the same
    /// latency and connection count.
    var transport = "xmpp"

    func run() async throws {
        say("fcm-worker bench downstream: \(runs.count) run(s) of about \(seconds) s, "
              + "\(ProcessInfo.processInfo.activeProcessorCount) cores; simulator in its own process, TLS on loopback")
        try await BenchDatabase.withSchema(in: databaseURL) { url in
            // Each run is compared with the references measured right before and right after
            // it (`ReferenceBracket`): the machine's speed drifts within minutes, and a
            // ratio should compare like with like. A run's after is the next run's before.
            var before = try await reference(url: url)
            func bracket() async throws -> ReferenceBracket? {
                let after = try await reference(url: url)
                defer { before = after }
                guard let first = before, let second = after else { return nil }
                return ReferenceBracket(before: first, after: second)
            }
            for run in runs {
                let comparisons = try await report(run, url: url)
                compare(comparisons, with: try await bracket())
            }
            if multicastRows > 0 {
                let comparison = try await reportMulticast(url: url)
                compare([comparison], with: try await bracket())
            }
            if statementRows > 0 {
                let costs = try await measureDatabaseCost(url: url)
                reportDatabaseCost(costs, against: try await bracket())
            }
        }
        say("peak RSS of the worker process: \(BenchDatabase.peakResidentMegabytes()) MB")
    }

    /// Stores `referenceMessages` upstream messages and prints what one cost (nil when off).
    private func reference(url: String) async throws -> ReferenceBracket.Cost? {
        guard referenceMessages > 0 else { return nil }
        let measured = try await UpstreamBench.storeReference(url: url, messages: referenceMessages)
        say(String(format: "reference: %d upstream messages stored (immediate mode, 4 connections), %.0f msgs/s; "
                       + "CPU per stored message: worker %.1f µs, PostgreSQL %@",
                   measured.messages, measured.persistedPerSecond, measured.spent.worker,
                   measured.spent.postgres.map { String(format: "%.1f µs", $0) } ?? "not measured"))
        return ReferenceBracket.Cost(worker: measured.spent.worker, postgres: measured.spent.postgres)
    }

    /// A measured run's CPU, to be set against the references around it once the one after
    /// it is measured.
    private struct Comparison {
        /// What the line names first (`v1 over HTTP/2`), when a run printed more than one.
        var label: String?
        let result: Result
        let units: Int
        let unit: String
    }

    /// HTTP multicast rows of `multicastTokens` tokens each: what a token costs.
    private func reportMulticast(url: String) async throws -> Comparison {
        let tokens = multicastRows * multicastTokens
        let result = try await measure(connections: 1, rows: multicastRows, tokensPerRow: multicastTokens, url: url)
        say(String(format: "HTTP multicast: %d rows of %d tokens, %.0f tokens/s", multicastRows, multicastTokens,
                   Double(tokens) / result.ackSeconds))
        say("  " + CPUAccount.describe(from: result.before, to: result.after, messages: tokens,
                                       cores: ProcessInfo.processInfo.activeProcessorCount).replacingOccurrences(of: "per message", with: "per token"))
        return Comparison(result: result, units: tokens, unit: "token")
    }

    /// What the outbox's statements cost PostgreSQL alone, without the sending: the worker's
    /// claim and write-back, the two least costs of any outbox that keeps each row's status
    /// in its row, and reading the rows as a claim does. PostgreSQL's CPU per row of each
    /// step (nil when the cluster is not local).
    private func measureDatabaseCost(url: String) async throws -> [(step: OutboxDatabaseCost, micros: Double?)] {
        let cpu = await CPUAccount.locate(databaseURL: url)
        var costs: [(step: OutboxDatabaseCost, micros: Double?)] = []
        for step in OutboxDatabaseCost.allCases {
            try await OutboxDatabaseCost.prepare(rows: statementRows, databaseURL: url)
            let before = cpu.sample()
            let rows = try await step.run(databaseURL: url)
            let after = cpu.sample()
            costs.append((step, CPUAccount.Spent(from: before, to: after, units: rows).postgres))
        }
        return costs
    }

    /// Prints `costs`, each against PostgreSQL's CPU per stored upstream message in `bracket`.
    private func reportDatabaseCost(_ costs: [(step: OutboxDatabaseCost, micros: Double?)], against bracket: ReferenceBracket?) {
        say("the outbox's statements alone (\(statementRows) rows, \(OutboxDatabaseCost.batch)-row transactions, "
              + "one connection, nothing sent), PostgreSQL's CPU per row:")
        for (step, micros) in costs {
            guard let micros else {
                say("  \(step): PostgreSQL not measured (not a local cluster)")
                continue
            }
            var line = String(format: "  %@: %.1f µs", step.description, micros)
            if let stored = bracket?.mean.postgres { line += String(format: " = %.2f× a stored upstream message", micros / stored) }
            say(line)
        }
        if let bracket { say("  (stored upstream messages before and after: \(bracket.drift))") }
    }

    /// "per token against a stored upstream message: worker …, PostgreSQL …", against the
    /// mean of the references before and after the run, then how far they moved.
    private func compare(_ comparisons: [Comparison], with bracket: ReferenceBracket?) {
        guard let bracket else { return }
        let stored = bracket.mean
        for comparison in comparisons {
            let spent = CPUAccount.Spent(from: comparison.result.before, to: comparison.result.after, units: comparison.units)
            var line = "  " + (comparison.label.map { "\($0), " } ?? "")
            line += String(format: "per %@ against a stored upstream message: worker %.1f / %.1f µs = %.2f×",
                           comparison.unit, spent.worker, stored.worker, spent.worker / stored.worker)
            if let postgres = spent.postgres, let storedPostgres = stored.postgres {
                line += String(format: ", PostgreSQL %.2f / %.1f µs = %.2f×", postgres, storedPostgres, postgres / storedPostgres)
            }
            say(line)
        }
        say("  (stored upstream messages before and after: \(bracket.drift))")
    }

    private func report(_ run: Run, url: String) async throws -> [Comparison] {
        if transport == "v1" { return try await reportV1(run, url: url) }
        let messages = max(5_000, min(500_000, Int(run.bound) * seconds))
        let result = try await measure(connections: run.connections, roundTripMilliseconds: run.roundTripMilliseconds,
                                       rows: messages, url: url)
        say(String(format: "%@: %d messages, sent %.0f msgs/s, acked %.0f msgs/s = %.0f%% of the bound %.0f msgs/s; "
                           + "ack round trip p50 %.1f ms, p99 %.1f ms",
                   run.description, messages, result.sentPerSecond, result.ackedPerSecond,
                   100 * result.ackedPerSecond / run.bound, run.bound, result.p50 * 1000, result.p99 * 1000))
        say("  " + CPUAccount.describe(from: result.before, to: result.after, messages: messages,
                                       cores: ProcessInfo.processInfo.activeProcessorCount))
        say("  " + result.database)
        return [Comparison(result: result, units: messages, unit: "message")]
    }

    /// A run over v1 (`run.connections` HTTP/2 connections of 100 streams, the simulator
    /// answering after the run's latency), then the same over XMPP, and how they compare.
    private func reportV1(_ run: Run, url: String) async throws -> [Comparison] {
        let messages = max(5_000, min(500_000, Int(run.bound) * seconds))
        let v1 = try await measure(connections: run.connections, roundTripMilliseconds: run.roundTripMilliseconds, rows: messages,
                                   url: url, transport: "v1")
        let xmpp = try await measure(connections: run.connections, roundTripMilliseconds: run.roundTripMilliseconds, rows: messages,
                                     url: url, transport: "xmpp")
        let cores = ProcessInfo.processInfo.activeProcessorCount
        for (name, result) in [("v1 over HTTP/2", v1), ("xmpp", xmpp)] {
            say(String(format: "%@, %@: %d messages, %.0f msgs/s = %.0f%% of the bound %.0f msgs/s; answer round trip p50 %.1f ms, p99 %.1f ms",
                       run.description, name, messages, result.ackedPerSecond, 100 * result.ackedPerSecond / run.bound, run.bound,
                       result.p50 * 1000, result.p99 * 1000))
            say("  " + CPUAccount.describe(from: result.before, to: result.after, messages: messages, cores: cores))
            say("  " + result.database)
        }
        let v1Spent = CPUAccount.Spent(from: v1.before, to: v1.after, units: messages)
        let xmppSpent = CPUAccount.Spent(from: xmpp.before, to: xmpp.after, units: messages)
        var line = String(format: "  v1 against xmpp: throughput %.2f×, CPU per message: worker %.2f×",
                          v1.ackedPerSecond / xmpp.ackedPerSecond, v1Spent.worker / xmppSpent.worker)
        if let v1Postgres = v1Spent.postgres, let xmppPostgres = xmppSpent.postgres {
            line += String(format: ", PostgreSQL %.2f×, worker + PostgreSQL %.2f×", v1Postgres / xmppPostgres,
                           (v1Spent.worker + v1Postgres) / (xmppSpent.worker + xmppPostgres))
        }
        say(line)
        return [Comparison(label: "v1 over HTTP/2", result: v1, units: messages, unit: "message"),
                Comparison(label: "xmpp", result: xmpp, units: messages, unit: "message")]
    }

    struct Result {
        var sentPerSecond: Double
        var ackedPerSecond: Double
        var p50: Double
        var p99: Double
        /// From the first send to the last answer.
        var ackSeconds: Double
        /// CPU used so far, at the start and the end of the sending.
        var before: CPUAccount.Sample
        var after: CPUAccount.Sample
        /// What the sending asked of PostgreSQL: transactions, row versions.
        var database: String
    }

    /// The counters of this database and its outbox table that say how the sending used them.
    private struct DatabaseCounters {
        var commits: Int64
        var updates: Int64
        var hotUpdates: Int64

        static func read(_ connection: PostgresConnection) async throws -> DatabaseCounters {
            // A session may keep a snapshot of the counters (stats_fetch_consistency): read fresh ones.
            _ = try await connection.execute("SELECT pg_stat_clear_snapshot()")
            let row = try await connection.query("""
                SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
                       coalesce((SELECT n_tup_upd FROM pg_stat_user_tables WHERE relid = 'downstream_messages'::regclass), 0),
                       coalesce((SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'downstream_messages'::regclass), 0)
                """).first
            return DatabaseCounters(commits: row?.int(0) ?? 0, updates: row?.int(1) ?? 0, hotUpdates: row?.int(2) ?? 0)
        }

        /// "PostgreSQL: 0.04 commits, 2.00 row updates (0% HOT) per message".
        static func describe(from start: DatabaseCounters, to end: DatabaseCounters, messages: Int) -> String {
            let updates = end.updates - start.updates
            return String(format: "PostgreSQL: %.3f commits and %.2f row updates per message (%.0f%% of the updates HOT)",
                          Double(end.commits - start.commits) / Double(messages), Double(updates) / Double(messages),
                          updates > 0 ? 100 * Double(end.hotUpdates - start.hotUpdates) / Double(updates) : 0)
        }
    }

    /// Sends `rows` outbox rows (to one token each, or multicasts of `tokensPerRow` over
    /// HTTP) through a worker with `connections` CCS connections to a simulator that answers
    /// after `roundTripMilliseconds`.
    private func measure(connections: Int, roundTripMilliseconds: Int = 1, rows messages: Int, tokensPerRow: Int? = nil,
                         url: String, transport: String = "xmpp") async throws -> Result {
        try await PostgresConnection.withConnection(url) { connection in
            try await connection.execute("TRUNCATE downstream_messages, device_tokens, outbox_claims")
            try await connection.execute("CHECKPOINT")

            let v1 = transport == "v1"
            let simulator = try await SimulatorProcess.start(arguments: [v1 ? "--v1-latency" : "--ack-delay", "\(roundTripMilliseconds)", "--quiet"])
            defer { simulator.stop() }
            var configuration = try WorkerConfiguration.parse(arguments: [], environment: simulator.environment)
            configuration.databaseURL = url
            // Over v1, one CCS connection stays idle beside the HTTP/2 connections measured.
            configuration.connections = v1 ? 1 : connections
            configuration.v1Connections = connections
            if !v1 { configuration.serviceAccountFile = nil }
            configuration.spoolFile = simulator.directory + "/spool"
            let connected = Atomic<Int>(0)
            let worker = FCMWorker(configuration: configuration, handlers: UpstreamHandlers(),
                                   logger: Logger(label: "bench", minimumLevel: .error), observer: { event in
                                       if case .connected = event { connected.add(1, ordering: .relaxed) }
                                   })
            let task = Task { try await worker.run() }
            defer { task.cancel() }
            let deadline = ContinuousClock.now + .seconds(30)
            while connected.load(ordering: .relaxed) < configuration.connections {
                guard ContinuousClock.now < deadline else { throw SimulatorError("the worker did not connect \(connections) time(s)") }
                try await Task.sleep(for: .milliseconds(10))
            }

            let cpu = await CPUAccount.locate(databaseURL: url)
            // One statement, so the rows appear at once; the worker is woken by its NOTIFY. The
            // statistics are refreshed at once, as autovacuum would within a minute: without
            // them the planner reads and sorts every due row for each claim (a new table's
            // first burst), which is not the steady state this measures.
            _ = try await connection.pipeline([
                PostgresStatement("BEGIN"),
                tokensPerRow.map { tokens in
                    PostgresStatement("""
                        INSERT INTO downstream_messages (registration_ids, payload)
                        SELECT ARRAY(SELECT 'bench-token-' || g || '-' || t FROM generate_series(1, $2) AS t),
                               '{"data":{"text":"benchmark payload"},"priority":"high"}'::jsonb
                        FROM generate_series(1, $1) AS g
                        """, [.int(Int64(messages)), .int(Int64(tokens))])
                } ?? OutboxDatabaseCost.insertRows(messages, transport: transport),
                PostgresStatement("ANALYZE downstream_messages"),
                PostgresStatement("COMMIT"),
            ])
            // From here: the sending (the rows' insert is the application's cost, not the sender's).
            let before = cpu.sample(liveChild: simulator.processIdentifier)
            let countersBefore = try await DatabaseCounters.read(connection)
            let limit = ContinuousClock.now + .seconds(Int64(messages / 1000 + 120))
            let lastRow = try await connection.query("SELECT max(id) FROM downstream_messages").first?.int(0) ?? 0
            while true {
                // Polling must not weigh on the database it measures: while claims are open or the
                // last row is not claimed yet, two small tables say so. Then the open rows (rows
                // due again, read by id), and once none is left, the whole outbox, once: only a
                // row of a gap, visible but not yet taken, escapes the first (migration 0009).
                let claimed = try await connection.query("""
                    SELECT NOT EXISTS (SELECT 1 FROM outbox_claims) AND (SELECT max(frontier) FROM outbox_cursors) >= $1
                    """, [.int(lastRow)]).first?.bool(0) == true
                if claimed,
                   try await connection.query("SELECT 1 FROM downstream_messages_open_shown WHERE available_at IS NOT NULL LIMIT 1").isEmpty,
                   try await connection.query("SELECT 1 FROM downstream_messages WHERE available_at IS NOT NULL LIMIT 1").isEmpty {
                    break
                }
                guard ContinuousClock.now < limit else { throw SimulatorError("the outbox was not sent in time") }
                try await Task.sleep(for: .milliseconds(200))
            }
            let after = cpu.sample(liveChild: simulator.processIdentifier)
            worker.requestShutdown()
            _ = try? await task.value
            // Backends hand their counters over when idle, at most once a second, and when they
            // end (the worker's have, with its pools).
            try await Task.sleep(for: .milliseconds(1100))
            let countersAfter = try await DatabaseCounters.read(connection)

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
                          p50: row?.double(3) ?? .nan, p99: row?.double(4) ?? .nan, ackSeconds: row?.double(2) ?? .nan,
                          before: before, after: after,
                          database: DatabaseCounters.describe(from: countersBefore, to: countersAfter, messages: messages))
        }
    }
}
