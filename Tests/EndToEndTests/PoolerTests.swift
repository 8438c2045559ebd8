import Foundation
import Postgres
import Testing
@testable import Upstream
@testable import Worker
import Runtime
import Simulator
import TestSupport

/// The worker behind a real PgBouncer in transaction pooling mode, as production often runs
/// it: `scripts/test` starts Debian's PgBouncer in front of the test cluster
/// (`FCM_TEST_PGBOUNCER_PORT`), handing server connections out in turn, so that a client's
/// consecutive transactions land on different server connections.
/// PgBouncer's port, from `scripts/test` (`FCM_TEST_PGBOUNCER_PORT`).
private let pgbouncerPort = ProcessInfo.processInfo.environment["FCM_TEST_PGBOUNCER_PORT"].flatMap { Int($0) }

@Suite(.enabled(if: pgbouncerPort != nil, "needs PgBouncer in front of the test cluster (scripts/test starts one)"))
struct PoolerTests {
    /// A database of its own (PgBouncer cannot pass the schema option the other tests use),
    /// and its URL through PgBouncer.
    /// `password`: carried in the pooled URL (PgBouncer here takes any).
    private static func pooledDatabase(password: String? = nil) async throws -> (direct: TestDatabase, pooled: String) {
        let (database, name) = try await TestDatabase.makeDedicated()
        let port = try #require(pgbouncerPort)
        return (database, "postgresql://postgres\(password.map { ":\($0)" } ?? "")@127.0.0.1:\(port)/\(name)")
    }

    /// Upstream messages stored once each, and outbox rows (a handler's replies and rows
    /// inserted by SQL) all sent, through the pooler; the outbox's LISTEN goes over the
    /// direct URL, so that rows go out on NOTIFY as on a direct connection.
    @Test(arguments: ["immediate", "durable"])
    func upstreamAndOutboxWorkThroughATransactionPooler(ackMode: String) async throws {
        let log = DownstreamLog()
        let ccs = try TestCCS(log: log, configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let (database, pooled) = try await Self.pooledDatabase()
        var configuration = try ccs.worker(database: database)
        configuration.databaseURL = pooled
        configuration.databasePooler = .transaction
        configuration.databaseDirectURL = database.url
        configuration.ackMode = ackMode == "durable" ? .durable : .immediate
        configuration.concurrency = 4
        let (task, events) = startWorker(configuration)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        for index in 0..<2_000 { ccs.simulator.injectUpstream(from: "d\(index % 40)", messageID: "p\(index)") }
        // A redelivery of some of them: stored once all the same.
        for index in 0..<50 { ccs.simulator.injectUpstream(from: "d\(index % 40)", messageID: "p\(index)") }
        await database.waitForRows(in: "upstream_messages", count: 2_000, within: .seconds(60))
        #expect(try await database.count("upstream_messages") == 2_000)
        #expect(try await database.count("upstream_messages", where: "message_id LIKE 'p%'") == 2_000)

        try await events.wait(for: "the outbox's LISTEN", timeout: .seconds(10)) {
            $0.contains { if case .outboxListening = $0 { true } else { false } }
        }
        try await database.insertOutbox((0..<500).map { ("device-\($0 % 25)", #"{"data":{"k":"v"}}"#) })
        try await database.waitForOutbox("status = 'acked'", count: 500, within: .seconds(30))
        #expect(Set(log.all.compactMap { $0.json["message_id"]?.stringValue }).count == 500)
        #expect(ccs.simulator.violations.isEmpty, "\(ccs.simulator.violations)")
        task.cancel()
        try await task.value
    }

    /// Without `--database-pooler transaction`, a worker behind a transaction pooler stops
    /// within seconds with one line naming the setting (it used to retry forever, storing
    /// part of what it acked); nothing it acked is lost: what it could not commit is
    /// spooled, and a start with the setting stores it. `migrate` through the pooler needs
    /// the direct URL.
    ///
    /// The detection keys on the SQLSTATE of a statement run by its prepared name, never on
    /// the message's text: with the password `fcm`, the log's redaction once turned the
    /// statement's name into `***_…`, the detection never fired, and the worker dead-lettered
    /// message after message for good (`does`: a password inside the server's message).
    /// Those errors are the database's state, not the messages': none is dead-lettered.
    @Test(arguments: ["fcm", "does"])
    func withoutTheSettingAWorkerBehindATransactionPoolerStopsNamingIt(password: String) async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let (database, pooled) = try await Self.pooledDatabase(password: password)
        let spool = FileManager.default.temporaryDirectory.appendingPathComponent("spool-\(UUID())").path
        let (worker, errors) = try WorkerProcess.start(ccs, databaseURL: pooled, spool: spool, ["--shutdown-timeout", "3"])
        defer { if worker.isRunning { worker.terminate() } }
        // Delivered once a session binds (the worker may stop before it does: its first
        // statements at start find the pooler).
        for index in 0..<3_000 { ccs.simulator.injectUpstream(from: "d\(index % 40)", messageID: "w\(index)") }
        try await database.insertOutbox((0..<200).map { ("device-\($0 % 25)", #"{"data":{"k":"v"}}"#) })
        try await WorkerProcess.waitForExit(worker, limit: .seconds(30))
        let output = String(decoding: await readToEnd(errors.fileHandleForReading), as: UTF8.self)
        #expect(worker.terminationStatus == 2, "\(output.suffix(3000))")
        let last = output.split(separator: "\n").last.map(String.init) ?? ""
        #expect(last.contains("--database-pooler transaction") && last.contains("--database-direct-url"), "\(last)")
        #expect(last.contains("\"fcm_") && (last.contains("does not exist") || last.contains("already exists")),
                "the server's message as it was: \(last)")
        #expect(try await database.count("dead_letters") == 0, "\(output.suffix(3000))")

        // What it acked is stored once, by a start with the setting.
        let sessionsBefore = ccs.simulator.counters.sessionsBound
        let (second, secondErrors) = try WorkerProcess.start(ccs, databaseURL: pooled, spool: spool,
                                                             ["--database-pooler", "transaction", "--database-direct-url", database.url])
        defer { if second.isRunning { second.terminate() } }
        // The second worker is up (it bound a session of its own) before anything is judged:
        // the first may have acked, stored and sent everything already, and a SIGTERM that
        // came while the second was still loading killed it before it could trap the signal.
        try await waitUntil("the second worker's session", within: .seconds(60)) { ccs.simulator.counters.sessionsBound > sessionsBefore }
        try await ccs.simulator.wait(for: "3000 acks", timeout: .seconds(60)) { Set($0.acked).count >= 3_000 }
        await database.waitForRows(in: "upstream_messages", count: 3_000, within: .seconds(60))
        try await database.waitForOutbox("status = 'acked'", count: 200, within: .seconds(30))
        kill(second.processIdentifier, SIGTERM)
        try await WorkerProcess.waitForExit(second)
        let secondOutput = String(decoding: await readToEnd(secondErrors.fileHandleForReading), as: UTF8.self)
        #expect(second.terminationStatus == 0, "\(secondOutput.suffix(3000))")
        #expect(try await database.count("upstream_messages") == 3_000)

        let refused = try await CommandLineTests.run(["migrate", "--database-url", pooled, "--database-pooler", "transaction"])
        #expect(refused.status == 2)
        #expect(refused.standardError.contains("needs --database-direct-url"), "\(refused.standardError)")
        let migrated = try await CommandLineTests.run(["migrate", "--database-url", pooled, "--database-pooler", "transaction",
                                                       "--database-direct-url", database.url])
        #expect(migrated.status == 0, "\(migrated.standardError)")
    }
}
