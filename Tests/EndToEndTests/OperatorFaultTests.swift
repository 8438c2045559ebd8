import Foundation
import Handlers
import Postgres
import Runtime
import Simulator
import Testing
import Worker
import TestSupport

/// What an operator's fault trial found, each fixed: settings and files an operator gets
/// wrong get one clear line and a status that stops a restart loop, and a failing
/// endpoint is said in the log instead of retried in silence.
@Suite struct OperatorFaultTests {
    /// A migration holding `COMMIT` was recorded as applied while what followed it ran
    /// outside its transaction; a failing migration's error did not name its file.
    @Test func aMigrationThatEndsItsTransactionIsRefusedAndAFailingOneIsNamed() async throws {
        let database = try await TestDatabase.make(migrated: false)
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("migrations-\(UUID())").path
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        try "CREATE TABLE tickets (id int);\n".write(toFile: folder + "/0001_tickets.sql", atomically: true, encoding: .utf8)
        try "CREATE TABLE notes (id int);\nCOMMIT;\nCREATE INDEX notes_id ON notes (id);\n"
            .write(toFile: folder + "/0002_notes.sql", atomically: true, encoding: .utf8)
        let refused = try await CommandLineTests.run(["migrate", "--database-url", database.url, "--migrations-dir", folder])
        #expect(refused.status == 2)
        #expect(refused.standardError.contains("migration app/0002_notes holds a COMMIT statement"), "\(refused.standardError)")
        #expect(try await database.query("SELECT to_regclass('schema_migrations') IS NULL OR NOT EXISTS (SELECT FROM schema_migrations)")
            .first?.bool(0) == true, "nothing was applied")
        #expect(try await database.query("SELECT to_regclass('notes') IS NULL").first?.bool(0) == true)

        // A COMMIT inside a function's body is the function's.
        try "CREATE TABLE notes (id int);\nCREATE PROCEDURE tidy() LANGUAGE plpgsql AS $$ BEGIN COMMIT; END $$;\n"
            .write(toFile: folder + "/0002_notes.sql", atomically: true, encoding: .utf8)
        try "CREATE TABLE broken (id no_such_type);\n".write(toFile: folder + "/0003_broken.sql", atomically: true, encoding: .utf8)
        let failed = try await CommandLineTests.run(["migrate", "--database-url", database.url, "--migrations-dir", folder])
        #expect(failed.status == 2)
        #expect(failed.standardError.contains("migration app/0003_broken failed and was rolled back"), "\(failed.standardError)")
        #expect(failed.standardError.contains("no_such_type"))
        #expect(try await database.count("schema_migrations", where: "migration_set = 'app'") == 2)
        #expect(try await database.query("SELECT to_regclass('broken') IS NULL").first?.bool(0) == true)
    }

    /// A CA file of garbage exited 1 at the first connection (a restart loop under
    /// systemd); now it is refused at start with status 2 and one line.
    @Test func aCAFileOfGarbageExitsWithStatus2AndOneLine() async throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("garbage-\(UUID()).pem").path
        try "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n".write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let outcome = try await CommandLineTests.run(["run", "--sender-id", "1", "--server-key", "k", "--database-url", "postgresql://h/d",
                                                      "--ca-file", file])
        #expect(outcome.status == 2)
        #expect(outcome.standardError == "fcm-worker: the CA file \(file) holds no PEM certificate OpenSSL can read\n")
    }

    /// An HTTP endpoint that cannot be reached (here a host that does not resolve) left the
    /// rows retrying with nothing in the log; now it says so, once a minute.
    @Test func anHTTPEndpointThatCannotBeReachedIsLogged() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.downstreamWorker(database: database)
        configuration.httpEndpoint = "no-such-host.invalid:443"
        let (_, task, lines) = launchLoggedWorker(configuration)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        _ = try await database.query("""
            INSERT INTO downstream_messages (target, transport, payload) VALUES ('token-b', 'http', '{"data":{"k":"v"}}'),
                                                                                ('token-c', 'http', '{"data":{"k":"v"}}')
            """)
        try await waitUntil("the failure is logged", within: .seconds(20)) {
            lines.withLock { $0 }.contains { $0.contains("HTTP requests to FCM fail") }
        }
        let said = lines.withLock { $0 }.filter { $0.contains("HTTP requests to FCM fail") }
        #expect(said.count == 1, "once a minute: \(said)")
        #expect(said.first?.contains("no-such-host.invalid") == true)
        #expect(said.first?.contains("check --http-endpoint and --ca-file") == true)
        try await database.waitForOutbox("status = 'retry'", count: 2)
    }

    /// `--retry-max-age` limits retries, not first sends: after an outage longer than a day
    /// the backlog was expired unsent, with a wrong reason ("time to live (2419200 s)
    /// passed") and no log line.
    @Test func aBacklogOlderThanTheRetryMaximumAgeIsSentAndOnlyRetriesStopThere() async throws {
        let log = DownstreamLog()
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let rows = try await database.query("""
            INSERT INTO downstream_messages (target, payload, created_at, attempts, status) VALUES
                ('backlog', '{"data":{"k":"v"}}', now() - interval '2 days', 0, 'pending'),
                ('retried', '{"data":{"k":"v"}}', now() - interval '2 days', 3, 'retry'),
                ('short-lived', '{"data":{"k":"v"},"time_to_live":60}', now() - interval '2 minutes', 0, 'pending')
            RETURNING id
            """).compactMap { $0.int(0) }
        let (_, task, lines) = launchLoggedWorker(try ccs.downstreamWorker(database: database))
        defer { task.cancel() }
        try await database.waitForOutbox("status IN ('acked', 'expired')", count: 3)
        #expect(try await database.outboxRow(rows[0])["status"] == "acked", "a first send is limited by its time to live only")
        let retried = try await database.outboxRow(rows[1])
        #expect(retried["status"] == "expired" && retried["error_code"] == "RETRY_MAX_AGE")
        #expect(retried["error_description"]?.contains("over --retry-max-age (86400 s)") == true, "\(retried)")
        let shortLived = try await database.outboxRow(rows[2])
        #expect(shortLived["status"] == "expired" && shortLived["error_code"] == "EXPIRED")
        #expect(shortLived["error_description"] == "its time to live (60 s) passed before it could be sent")
        #expect(log.all.map { $0.json["to"]?.stringValue } == ["backlog"])
        let said = lines.withLock { $0 }.filter { $0.contains("expired without being sent") }
        #expect(said.count == 2, "one line per reason: \(said)")
    }

    /// A shutdown that cannot keep what it acked (the spool's disk full, or gone as here)
    /// exited 0 after logging the loss: a supervisor saw a clean stop. Now it exits 1 with
    /// the count.
    @Test func aShutdownThatLosesAckedMessagesExitsNonZeroWithTheCount() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let proxy = try FaultProxy(targetPort: URLComponents(string: try TestDatabase.baseURL)!.port!)
        defer { proxy.stop() }
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("gone-\(UUID())").path
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let spool = folder + "/spool"
        let (worker, errors) = try WorkerProcess.start(ccs, databaseURL: proxy.url(replacingPortIn: database.url), spool: spool,
                                                       ["--shutdown-timeout", "1", "--database-timeout", "1", "--concurrency", "1"])
        defer { if worker.isRunning { worker.terminate() } }
        try await ccs.simulator.waitForBoundSessions(1)
        proxy.set(.stall(newConnectionsWork: false))
        for index in 0..<100 { ccs.simulator.injectUpstream(from: "d\(index % 10)", messageID: "lost-\(index)") }
        try await ccs.simulator.wait(for: "every ack", timeout: .seconds(30)) { Set($0.acked).count >= 100 }
        // The spool's storage goes (an unmounted volume; as root, a full disk cannot be had
        // without mounting one): the shutdown cannot write it.
        try FileManager.default.removeItem(atPath: folder)
        _ = try await WorkerProcess.terminate(worker, limit: .seconds(20))
        let log = String(decoding: await readToEnd(errors.fileHandleForReading), as: UTF8.self)
        #expect(worker.terminationStatus == 1, "\(log.suffix(2000))")
        let last = log.split(separator: "\n").last.map(String.init) ?? ""
        #expect(last.hasPrefix("fcm-worker: the shutdown lost 100 acked message(s): could not write the spool \(spool)"), "\(last)")
    }

    /// What a shutdown spooled is counted, and so is what the next start replays (a counter
    /// that rises in a process's last moment is seldom scraped: the replay's is).
    @Test func spooledAndReplayedMessagesAreCounted() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let proxy = try FaultProxy(targetPort: URLComponents(string: try TestDatabase.baseURL)!.port!)
        defer { proxy.stop() }
        var configuration = try ccs.worker(database: database)
        configuration.databaseURL = proxy.url(replacingPortIn: database.url)
        configuration.databaseTimeout = .seconds(1)
        configuration.shutdownTimeout = .seconds(1)
        var handlers = UpstreamHandlers()
        handlers.register("store", StoreHandler())
        let first = FCMWorker(configuration: configuration, handlers: handlers, logger: Logger(label: "test", minimumLevel: .warning) { TestLog.record($0) })
        let task = Task { try await first.run() }
        try await ccs.simulator.waitForBoundSessions(1)
        proxy.set(.stall(newConnectionsWork: false))
        for index in 0..<50 { ccs.simulator.injectUpstream(from: "d\(index % 10)", messageID: "spooled-\(index)") }
        try await ccs.simulator.wait(for: "every ack", timeout: .seconds(30)) { Set($0.acked).count >= 50 }
        task.cancel()
        try await task.value
        #expect(first.metricsPage.contains("fcm_worker_upstream_spooled_total 50"))
        #expect(first.metricsPage.contains("fcm_worker_upstream_lost_total 0"))

        proxy.set(.pass)
        let second = FCMWorker(configuration: configuration, handlers: handlers, logger: Logger(label: "test", minimumLevel: .warning) { TestLog.record($0) })
        let next = Task { try await second.run() }
        defer { next.cancel() }
        await database.waitForRows(in: "upstream_messages", count: 50, within: .seconds(20))
        try await waitUntil("the replay is counted") { second.metricsPage.contains("fcm_worker_upstream_replayed_total 50") }
    }

    /// In journal mode, a journal that could not be written (its disk full) left its
    /// messages unacked for good: CCS sent no more on the connection, `/readyz` said ready,
    /// and nothing arrived until a restart. Now the write is tried again until it succeeds,
    /// `/readyz` and a metric say so meanwhile, and receiving resumes by itself.
    @Test func aJournalThatCannotBeWrittenIsRetriedAndReceivingResumes() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("journal-\(UUID())").path
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        var configuration = try ccs.worker(database: database)
        configuration.spoolFile = folder + "/spool"
        configuration.ackMode = .journal
        configuration.metricsAddress = "127.0.0.1:0"
        let events = WorkerEvents()
        var handlers = UpstreamHandlers()
        handlers.register("store", StoreHandler())
        let worker = FCMWorker(configuration: configuration, handlers: handlers,
                               logger: Logger(label: "test", minimumLevel: .warning) { TestLog.record($0) }, observer: { events.record($0) })
        let task = Task { try await worker.run() }
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        try await events.wait(for: "the metrics listener") { $0.contains { if case .serving = $0 { true } else { false } } }
        let port = events.all.compactMap { if case .serving(let port) = $0 { port } else { nil } }.first!
        for index in 0..<20 { ccs.simulator.injectUpstream(from: "d\(index % 5)", messageID: "before-\(index)") }
        try await ccs.simulator.wait(for: "20 acks") { Set($0.acked).count >= 20 }
        await database.waitForRows(in: "upstream_messages", count: 20, within: .seconds(10))
        // An idle worker keeps no journal: the next message opens a new segment.
        try await waitUntil("the journal is emptied") { UpstreamJournalFiles.names(beside: configuration.spoolFile).isEmpty }

        // The journal's disk goes: every write fails.
        try FileManager.default.removeItem(atPath: folder)
        for index in 0..<30 { ccs.simulator.injectUpstream(from: "d\(index % 5)", messageID: "during-\(index)") }
        try await waitUntil("a failed journal write is counted") { worker.metricsPage.contains("fcm_worker_journal_failing 1") }
        let probe = try await httpGet(port: port, path: "/readyz")
        #expect(probe.status == 503 && probe.body.contains("the journal cannot be written"), "\(probe)")
        #expect(Set(ccs.simulator.events.acked).count == 20, "nothing is acked that is not journaled")

        // The disk is back: the write goes through, the acks go out, receiving resumes.
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        try await ccs.simulator.wait(for: "50 acks", timeout: .seconds(20)) { Set($0.acked).count >= 50 }
        for index in 0..<10 { ccs.simulator.injectUpstream(from: "d\(index % 5)", messageID: "after-\(index)") }
        try await ccs.simulator.wait(for: "60 acks", timeout: .seconds(20)) { Set($0.acked).count >= 60 }
        await database.waitForRows(in: "upstream_messages", count: 60, within: .seconds(20))
        #expect(try await database.count("upstream_messages") == 60)
        #expect(worker.metricsPage.contains("fcm_worker_journal_failing 0"))
        #expect(try await httpGet(port: port, path: "/readyz").status == 200)
    }

    /// A negative `time_to_live` fails the row as invalid on every transport (over HTTP it
    /// once ended `expired`, elsewhere `failed INVALID_MESSAGE`).
    @Test func aNegativeTimeToLiveIsInvalidOnEveryTransport() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (task, _) = startWorker(try ccs.downstreamWorker(database: database))
        defer { task.cancel() }
        _ = try await database.query("""
            INSERT INTO downstream_messages (target, transport, payload) VALUES
                ('token-x', 'xmpp', '{"data":{"k":"v"},"time_to_live":-5}'),
                ('token-h', 'http', '{"data":{"k":"v"},"time_to_live":-5}')
            """)
        try await database.waitForOutbox("status IN ('failed', 'expired')", count: 2)
        let rows = try await database.query("SELECT transport, status, error_code FROM downstream_messages ORDER BY transport")
            .map { "\($0.string(0)!) \($0.string(1)!) \($0.string(2) ?? "-")" }
        #expect(rows == ["http failed INVALID_MESSAGE", "xmpp failed INVALID_MESSAGE"])
    }

    /// A row inserted below the claim frontier (an id taken earlier) is found by the worker's
    /// sweep for such rows, sent, counted and said (it was never sent and never shown).
    @Test func aRowNoClaimWouldSeeIsFoundSentAndCounted() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.downstreamWorker(database: database)
        configuration.downstream.strandedRowSweep = .milliseconds(200)
        let (worker, task, lines) = launchLoggedWorker(configuration)
        defer { task.cancel() }
        let ids = try await database.query("""
            INSERT INTO downstream_messages (target, payload) SELECT 'token-' || g, '{"data":{"k":"v"}}' FROM generate_series(1, 5) AS g RETURNING id
            """).compactMap { $0.int(0) }
        try await database.waitForOutbox("status = 'acked'", count: 5)
        _ = try await database.query("""
            INSERT INTO downstream_messages (id, target, payload, created_at)
            VALUES ($1, 'stranded', '{"data":{"k":"v"}}', now() - interval '5 minutes')
            """, [.int((ids.min() ?? 1) - 1)])
        try await database.waitForOutbox("status = 'acked' AND target = 'stranded'", count: 1)
        #expect(worker.metricsPage.contains(#"fcm_worker_outbox_stranded_rows_total{transport="xmpp"} 1"#))
        #expect(lines.withLock { $0 }.contains { $0.contains("no claim would have seen") })
    }
}
