import FCM
import Foundation
import Handlers
import Postgres
import Runtime
import Testing
import Worker

/// `status`, `dead-letters`, `outbox requeue` and `prune`, run as an operator runs them.
@Suite struct MaintenanceCommandTests {
    /// Runs `fcm-worker` with `arguments`; returns its status, standard output and error.
    static func fcmWorker(_ arguments: [String]) async throws -> (status: Int32, output: String, errors: String) {
        let process = Process()
        process.executableURL = try CommandLineTests.executable
        process.arguments = arguments
        process.environment = childEnvironment()
        let output = Pipe(), errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try launch(process)
        async let out = readToEnd(output.fileHandleForReading)
        async let err = readToEnd(errors.fileHandleForReading)
        let (outData, errData) = await (out, err)
        return (await exitStatus(of: process), String(decoding: outData, as: UTF8.self), String(decoding: errData, as: UTF8.self))
    }

    @Test func everySubcommandExplainsItself() async throws {
        for command in ["run", "migrate", "status", "dead-letters", "outbox", "prune", "groups", "send", "simulate", "bench"] {
            let outcome = try await Self.fcmWorker([command, "--help"])
            #expect(outcome.status == 0, "\(command) --help: \(outcome.errors)")
            #expect(outcome.output.hasPrefix("usage: fcm-worker \(command)"), "\(command)")
            let viaHelp = try await Self.fcmWorker(["help", command])
            #expect(viaHelp.output == outcome.output)
        }
    }

    @Test func theDefaultTransportIsShownAndSetAndRowsThatNameNoneTakeIt() async throws {
        let database = try await TestDatabase.make()
        let shown = try await Self.fcmWorker(["outbox", "default-transport", "--database-url", database.url])
        #expect(shown.status == 0 && shown.output == "default transport: xmpp\n", "\(shown)")
        let set = try await Self.fcmWorker(["outbox", "default-transport", "v1", "--database-url", database.url])
        #expect(set.status == 0 && set.output == "default transport: v1\n", "\(set)")
        let refused = try await Self.fcmWorker(["outbox", "default-transport", "carrier-pigeon", "--database-url", database.url])
        #expect(refused.status == 2 && refused.errors.contains("expected xmpp, http or v1"), "\(refused)")
        // Rows that name no transport, from SQL and from a handler, take the new default;
        // a multicast too (only an xmpp one is turned to http).
        _ = try await database.query("INSERT INTO downstream_messages (target, payload) VALUES ('a', '{}')")
        _ = try await database.query("INSERT INTO downstream_messages (registration_ids, payload) VALUES (ARRAY['b', 'c'], '{}')")
        _ = try await database.query("INSERT INTO downstream_messages (target, payload, transport) VALUES ('d', '{}', 'xmpp')")
        let transports = try await database.query("SELECT transport FROM downstream_messages ORDER BY id").compactMap { $0.string(0) }
        #expect(transports == ["v1", "v1", "xmpp"])
        let status = try await Self.fcmWorker(["status", "--json", "--database-url", database.url])
        #expect(try JSONValue.parse(status.output)["default_transport"] == "v1", "\(status)")
        let back = try await Self.fcmWorker(["outbox", "default-transport", "xmpp", "--json", "--database-url", database.url])
        #expect(try JSONValue.parse(back.output) == ["default_transport": "xmpp"])
        _ = try await database.query("INSERT INTO downstream_messages (registration_ids, payload) VALUES (ARRAY['e'], '{}')")
        #expect(try await database.query("SELECT transport FROM downstream_messages ORDER BY id DESC LIMIT 1").first?.string(0) == "http")
    }

    @Test func statusReportsWhatTheDatabaseHolds() async throws {
        let database = try await TestDatabase.make()
        _ = try await database.query("""
            INSERT INTO downstream_messages (target, payload, status, available_at) VALUES
                ('a', '{}', 'pending', now() - interval '30 seconds'), ('b', '{}', 'pending', now() + interval '1 hour'),
                ('c', '{}', 'failed', NULL)
            """)
        _ = try await database.query("""
            INSERT INTO dead_letters (message_id, raw_payload, reason, received_at, replayed_at) VALUES
                ('m1', '{}', 'handler_failed', now(), NULL), ('m2', '{}', 'handler_failed', now(), now()), (NULL, 'x', 'unreadable', now(), NULL)
            """)
        _ = try await database.query("INSERT INTO device_tokens (token, state) VALUES ('t1', 'unregistered'), ('t2', 'invalid'), ('t3', 'invalid')")
        let spool = FileManager.default.temporaryDirectory.appendingPathComponent("status-\(UUID()).spool").path
        try "00000000 {}\n00000000 {}\n".write(toFile: spool, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: spool) }

        let outcome = try await Self.fcmWorker(["status", "--json", "--database-url", database.url, "--spool-file", spool])
        #expect(outcome.status == 0, "\(outcome.errors)")
        let report = try JSONValue.parse(outcome.output)
        #expect(report["migrations"]?["pending"] == [])
        let outbox = report["outbox"]?.arrayValue ?? []
        let pending = outbox.first { $0["status"] == "pending" }
        #expect(pending?["rows"] == 2)
        #expect((pending?["oldest_due_age_seconds"]?.doubleValue ?? 0) >= 29)
        #expect(outbox.first { $0["status"] == "failed" }?["rows"] == 1)
        #expect(report["dead_letters"]?["handler_failed"] == ["not_replayed": 1, "all": 2])
        #expect(report["dead_letters"]?["unreadable"]?["all"] == 1)
        #expect(report["tokens"] == ["invalid": 2, "unregistered": 1])
        #expect(report["spool"]?["records"] == 2)
        // Which server it reached, and that it takes writes (after a failover: the new primary).
        let port = try #require(URLComponents(string: try TestDatabase.baseURL)?.port)
        #expect(report["database"] == ["host": "127.0.0.1", "port": JSONValue(port), "read_write": true])

        let text = try await Self.fcmWorker(["status", "--database-url", database.url, "--spool-file", spool])
        #expect(text.output.contains("database: 127.0.0.1:\(port), read-write\n"))
        #expect(text.output.contains("migrations: \(MigrationSet.workerCount) applied, none pending"))
        #expect(text.output.contains("xmpp pending: 2, oldest due"))
    }

    @Test func statusOnADatabaseNotMigratedYetListsThePendingMigrations() async throws {
        let database = try await TestDatabase.make(migrated: false)
        let outcome = try await Self.fcmWorker(["status", "--database-url", database.url])
        #expect(outcome.status == 0, "\(outcome.errors)")
        #expect(outcome.output.contains("migrations: \(MigrationSet.workerCount) PENDING: fcm-worker/0001_upstream"))
    }

    @Test func aReplayedDeadLetterIsHandledOnceAndTheOthersAreSkipped() async throws {
        let database = try await TestDatabase.make()
        let payload = #"{"from":"phone-1","category":"com.example","message_id":"dl-1","data":{"text":"hello"}}"#
        _ = try await database.query("INSERT INTO processed_upstream (message_id, outcome) VALUES ('dl-1', 'dead_lettered')")
        let rows = try await database.query("""
            INSERT INTO dead_letters (message_id, from_token, raw_payload, reason, error, attempts, received_at)
            VALUES ('dl-1', 'phone-1', $1, 'handler_failed', 'the database was down', 5, now()),
                   (NULL, NULL, 'not json', 'unreadable', 'bad JSON', 0, now())
            RETURNING id
            """, [.text(payload)])
        let (replayable, unreadable) = (rows[0].int(0)!, rows[1].int(0)!)

        let listed = try await Self.fcmWorker(["dead-letters", "list", "--json", "--database-url", database.url])
        #expect(try JSONValue.parse(listed.output).arrayValue?.count == 2)

        let first = try await Self.fcmWorker(["dead-letters", "replay", "\(replayable)", "\(unreadable)", "--json",
                                              "--database-url", database.url, "--handlers", "store"])
        #expect(first.status == 0, "\(first.errors)")
        let outcome = try JSONValue.parse(first.output)
        #expect(outcome["replayed"] == [JSONValue(Int(replayable))])
        #expect(outcome["skipped"]?.arrayValue?.first?["id"] == JSONValue(Int(unreadable)))
        #expect(try await database.count("upstream_messages", where: "message_id = 'dl-1'") == 1)
        #expect(try await database.count("processed_upstream", where: "message_id = 'dl-1' AND outcome = 'dead_lettered'") == 0)
        #expect(try await database.count("dead_letters", where: "id = \(replayable) AND replayed_at IS NOT NULL") == 1)

        // Again: replayed already, nothing handled twice.
        let second = try await Self.fcmWorker(["dead-letters", "replay", "--all", "--database-url", database.url, "--handlers", "store"])
        #expect(second.status == 0)
        #expect(second.output.hasPrefix("replayed 0"))
        let again = try await Self.fcmWorker(["dead-letters", "replay", "\(replayable)", "--database-url", database.url, "--handlers", "store"])
        #expect(again.output.contains("replayed already"))
        #expect(try await database.count("upstream_messages", where: "message_id = 'dl-1'") == 1)
    }

    /// A message no handler's route matches is kept, never marked handled: dead-lettered as
    /// `unrouted` with a warning (one per category and minute), counted, and replayed once
    /// the routes are fixed. Before, it was recorded as handled and counted so, and gone.
    @Test func anUnroutedMessageIsKeptAndReplayedOnceTheRoutesAreFixed() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let configuration = try ccs.worker(database: database)
        var handlers = UpstreamHandlers()
        handlers.register("support", StoreHandler(), for: .category("com.example.supportdesk"))
        let lines = BlockingLock<[String]>([])
        let worker = FCMWorker(configuration: configuration, handlers: handlers,
                               logger: Logger(label: "test", minimumLevel: .info) { line in
                                   TestLog.record(line)
                                   lines.withLock { $0.append(line) }
                               })
        let task = Task { try await worker.run() }
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        for index in 0..<3 { ccs.simulator.injectUpstream(from: "phone-\(index)", category: "com.example.app", messageID: "lost-\(index)") }
        ccs.simulator.injectUpstream(from: "phone-9", category: "com.example.supportdesk", messageID: "routed")
        await database.waitForRows(in: "dead_letters", count: 3, within: .seconds(10))
        await database.waitForRows(in: "upstream_messages", count: 1, within: .seconds(10))
        let letters = try await database.query("SELECT message_id, reason, error FROM dead_letters ORDER BY message_id")
        #expect(letters.map { $0.string(0) } == ["lost-0", "lost-1", "lost-2"])
        #expect(letters.allSatisfy { $0.string(1) == "unrouted" })
        #expect(letters.first?.string(2)?.contains(#"category "com.example.app"; routes: support: category "com.example.supportdesk""#) == true,
                "\(letters.first?.string(2) ?? "")")
        #expect(try await database.count("processed_upstream", where: "message_id LIKE 'lost-%' AND outcome = 'handled'") == 0,
                "none is recorded as handled")
        #expect(try await database.count("upstream_messages", where: "message_id LIKE 'lost-%'") == 0)
        let warnings = lines.withLock { $0 }.filter { $0.contains("dead-lettered as unrouted") }
        #expect(warnings.count == 1, "one warning per category and minute: \(warnings)")
        let page = worker.metricsPage
        #expect(page.contains("fcm_worker_upstream_unrouted_total 3"))
        #expect(page.contains("fcm_worker_upstream_handled_total 1"))
        task.cancel()
        _ = await task.result

        // The routes fixed (the store handler takes every category): replayed, once.
        let replay = try await Self.fcmWorker(["dead-letters", "replay", "--all", "--json", "--database-url", database.url,
                                               "--handlers", "store"])
        #expect(replay.status == 0, "\(replay.errors)")
        #expect(try JSONValue.parse(replay.output)["replayed"]?.arrayValue?.count == 3)
        #expect(try await database.count("upstream_messages", where: "message_id LIKE 'lost-%'") == 3)
    }

    @Test func requeueSendsFinishedRowsAgainAndPruneDeletesOnlyOldOnes() async throws {
        let database = try await TestDatabase.make()
        _ = try await database.query("""
            INSERT INTO downstream_messages (target, payload, status, available_at, attempts, error_code, created_at) VALUES
                ('a', '{}', 'failed', NULL, 3, 'InvalidRegistration', now()),
                ('b', '{}', 'expired', NULL, 1, 'TTL', now()),
                ('c', '{}', 'failed', NULL, 1, 'X', now() - interval '10 days'),
                ('d', '{}', 'acked', NULL, 1, NULL, now() - interval '10 days'),
                ('e', '{}', 'pending', now(), 0, NULL, now() - interval '10 days')
            """)
        let requeued = try await Self.fcmWorker(["outbox", "requeue", "--status", "failed", "--since", "1d", "--database-url", database.url])
        #expect(requeued.status == 0, "\(requeued.errors)")
        #expect(requeued.output == "requeued 1 row(s)\n")
        let rowA = try await database.query("SELECT status, attempts, error_code, available_at IS NOT NULL FROM downstream_messages WHERE target = 'a'")
        #expect(rowA.first?.string(0) == "pending")
        #expect(rowA.first?.int(1) == 0)
        #expect(rowA.first?.string(2) == nil)
        #expect(rowA.first?.bool(3) == true)
        #expect(try await database.count("downstream_messages", where: "target = 'b' AND status = 'expired'") == 1)
        let missing = try await Self.fcmWorker(["outbox", "requeue", "--database-url", database.url])
        #expect(missing.status == 2)

        _ = try await database.query("INSERT INTO processed_upstream (message_id, processed_at) VALUES ('old', now() - interval '10 days'), ('new', now())")
        _ = try await database.query("""
            INSERT INTO dead_letters (raw_payload, reason, received_at, created_at) VALUES ('x', 'unreadable', now(), now() - interval '10 days')
            """)
        let pruned = try await Self.fcmWorker(["prune", "--older-than", "7d", "--json", "--database-url", database.url])
        #expect(pruned.status == 0, "\(pruned.errors)")
        #expect(try JSONValue.parse(pruned.output) == ["processed_upstream": 1, "downstream_messages": 2, "dead_letters": 1])
        #expect(try await database.count("processed_upstream") == 1)
        // The pending row and the recent ones stay.
        #expect(try await database.query("SELECT target FROM downstream_messages ORDER BY target").map { $0.string(0) ?? "" } == ["a", "b", "e"])
        let tooSoon = try await Self.fcmWorker(["prune", "--older-than", "10m", "--database-url", database.url])
        #expect(tooSoon.status == 2)
        #expect(tooSoon.errors.contains("under an hour"))
    }

    /// No index on creation time (migration 0008): prune and requeue walk the outbox by id,
    /// batch after batch, and stop at the first batch entirely on the other side of the cutoff.
    @Test func pruneAndRequeueWalkTheOutboxAcrossBatches() async throws {
        let database = try await TestDatabase.make()
        // 12,000 old finished rows (over two batches of the walk), then old unfinished ones,
        // then new ones; the last old finished row comes after a new one.
        _ = try await database.query("""
            INSERT INTO downstream_messages (target, payload, status, available_at, created_at)
            SELECT 'old-' || g, '{}', 'acked', NULL, now() - interval '10 days' FROM generate_series(1, 12000) AS g
            """)
        _ = try await database.query("""
            INSERT INTO downstream_messages (target, payload, status, available_at, created_at) VALUES
                ('old-retry', '{}', 'retry', now(), now() - interval '10 days'),
                ('new-failed', '{}', 'failed', NULL, now()),
                ('old-late', '{}', 'failed', NULL, now() - interval '9 days'),
                ('new-acked', '{}', 'acked', NULL, now())
            """)
        let pruned = try await Self.fcmWorker(["prune", "--older-than", "7d", "--json", "--database-url", database.url])
        #expect(pruned.status == 0, "\(pruned.errors)")
        #expect(try JSONValue.parse(pruned.output)["downstream_messages"] == 12001)
        #expect(try await database.query("SELECT target FROM downstream_messages ORDER BY id").map { $0.string(0) ?? "" }
                == ["old-retry", "new-failed", "new-acked"])

        // Requeue since a day ago walks back from the newest row: 6,000 new failed rows ahead.
        _ = try await database.query("""
            INSERT INTO downstream_messages (target, payload, status, available_at, created_at)
            SELECT 'new-' || g, '{}', 'failed', NULL, now() FROM generate_series(1, 6000) AS g
            """)
        let requeued = try await Self.fcmWorker(["outbox", "requeue", "--status", "failed", "--since", "1d", "--database-url", database.url])
        #expect(requeued.status == 0, "\(requeued.errors)")
        #expect(requeued.output == "requeued 6001 row(s)\n")
        #expect(try await database.count("downstream_messages", where: "status = 'pending'") == 6001)
    }
}

extension MigrationSet {
    static var workerCount: Int { worker.migrations.count }
}
