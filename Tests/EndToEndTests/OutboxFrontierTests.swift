import Foundation
import Postgres
import Testing
@testable import Outbox
@testable import Upstream
@testable import Worker
import Runtime

/// The outbox survives what operators do to its table (migration 0011): emptied with
/// `TRUNCATE … RESTART IDENTITY`, its sequence set back, a row given an id by hand above
/// the sequence, rows inserted with a status or without a due time. Before, each of these
/// left rows that no claim would ever take while the worker ran on, silent.
@Suite struct OutboxFrontierTests {
    private static func insert(_ count: Int, on connection: PostgresConnection, prefix: String = "token") async throws -> [Int64] {
        try await connection.query("""
            INSERT INTO downstream_messages (target, payload)
            SELECT $2 || '-' || g, '{"data":{"n":"1"}}'::jsonb FROM generate_series(1, $1) AS g RETURNING id
            """, [.int(Int64(count)), .text(prefix)]).compactMap { $0.int(0) }
    }

    /// Claims (or sweeps) until a call takes nothing; every id taken, in order of taking.
    private static func claimAll(_ worker: String, on connection: PostgresConnection, sweep: Bool = false) async throws -> [Int64] {
        var taken: [Int64] = []
        for _ in 0..<10 {
            let rows = try await connection.query("SELECT id FROM \(sweep ? "fcm_outbox_sweep" : "fcm_outbox_claim")($1, 'xmpp', 1000, 60)",
                                                   [.text(worker)])
            // A call that resets the frontier takes nothing; the next one reads what it left.
            if rows.isEmpty, !taken.isEmpty { break }
            taken += rows.compactMap { $0.int(0) }.sorted()
        }
        return taken
    }

    private static func frontier(_ database: TestDatabase) async throws -> Int64? {
        try await database.query("SELECT frontier FROM outbox_cursors WHERE transport = 'xmpp'").first?.int(0)
    }

    /// A row inserted with an id below the claim frontier (an id taken earlier, or reused):
    /// no claim reads it, and it was never sent and never shown. The sweep for such rows
    /// finds it and queues it among the rows due again; the next sweep takes it.
    @Test func aRowBelowTheFrontierIsFoundQueuedAndCounted() async throws {
        let database = try await TestDatabase.make()
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        let before = try await Self.insert(20, on: connection)
        #expect(try await Self.claimAll("w", on: connection) == before)
        _ = try await connection.query("DELETE FROM outbox_claims")
        // Below the frontier, queued five minutes ago: the claims do not see it.
        let stranded = try await connection.query("""
            INSERT INTO downstream_messages (id, target, payload, created_at)
            VALUES ($1, 'stranded', '{"data":{"k":"v"}}', now() - interval '5 minutes') RETURNING id
            """, [.int(before[0] - 1)]).first?.int(0)
        #expect(try await Self.claimAll("w", on: connection).isEmpty)
        // A young one is left alone (a claim may still read it through its gaps).
        let young = try await connection.query("""
            INSERT INTO downstream_messages (id, target, payload) VALUES ($1, 'young', '{"data":{"k":"v"}}') RETURNING id
            """, [.int(before[0] - 2)]).first?.int(0)
        let found = try await OutboxStore.rescueStrandedRows(on: connection, olderThan: .seconds(120))
        #expect(found.map(\.id) == [stranded].compactMap { $0 } && found.first?.transport == "xmpp")
        // The sweep (every second in a worker, and when a retry falls due) takes it.
        #expect(try await Self.claimAll("w", on: connection, sweep: true) == [stranded].compactMap { $0 })
        // Found once: claimed now, it is not found again.
        #expect(try await OutboxStore.rescueStrandedRows(on: connection, olderThan: .seconds(120)).isEmpty)
        #expect(young != nil)
    }

    @Test func truncateWithRestartIdentityEmptiesClaimsAndFrontiersSoNewRowsAreClaimed() async throws {
        let database = try await TestDatabase.make()
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        let before = try await Self.insert(50, on: connection)
        #expect(try await Self.claimAll("w", on: connection) == before)
        #expect(try await Self.frontier(database) == before.last)
        try await connection.execute("TRUNCATE downstream_messages RESTART IDENTITY")
        #expect(try await database.count("outbox_claims") == 0, "the claims of the rows gone go with them")
        #expect(try await Self.frontier(database) == 0)
        let after = try await Self.insert(30, on: connection)
        #expect(after.first == 1, "the ids start again")
        #expect(try await Self.claimAll("w", on: connection) == after)
    }

    /// The sequence set back after the rows were deleted (a restore, a cut-over): the first
    /// claim finds the frontier above the sequence's top and resets it; the rows at or below
    /// the top, those committed and those committed later by a transaction already running,
    /// are each claimed once.
    @Test func aSequenceSetBackBelowTheFrontierResetsItWithoutSkippingARow() async throws {
        let database = try await TestDatabase.make()
        let connection = try await database.connect(), late = try await database.connect()
        defer { Task { await connection.close(); await late.close() } }
        let before = try await Self.insert(40, on: connection)
        #expect(try await Self.claimAll("w", on: connection) == before)
        try await connection.execute("DELETE FROM downstream_messages")
        try await connection.execute("ALTER SEQUENCE downstream_messages_id_seq RESTART")
        let first = try await Self.insert(5, on: connection)
        // A transaction that took its id before the reset and commits after it.
        try await late.execute("BEGIN")
        let lateID = try await late.query("INSERT INTO downstream_messages (target, payload) VALUES ('late', '{}') RETURNING id")
            .first?.int(0)
        let second = try await Self.insert(5, on: connection)
        let reset = try await connection.query("SELECT id FROM fcm_outbox_claim('w', 'xmpp', 1000, 60)")
        #expect(reset.isEmpty, "the call that resets takes nothing")
        #expect(try await Self.frontier(database) == second.last)
        var taken = try await Self.claimAll("w", on: connection)
        #expect(taken == first + second)
        try await late.execute("COMMIT")
        taken += try await Self.claimAll("w", on: connection)
        #expect(taken.sorted() == (first + second + [lateID!]).sorted())
        #expect(Set(taken).count == taken.count, "no row twice")
        // Rows after the reset go as usual.
        let third = try await Self.insert(3, on: connection)
        #expect(try await Self.claimAll("w", on: connection) == third)
    }

    /// A row inserted with an id far above the sequence used to move the frontier there:
    /// every row after it stayed pending, across restarts. Now it is claimed once (and again
    /// only when due again and no claim names it), and the frontier stays with the sequence.
    @Test func aRowWithAnIdAboveTheSequenceIsClaimedOnceAndTheRowsAfterItStillAre() async throws {
        let database = try await TestDatabase.make()
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        let before = try await Self.insert(3, on: connection)
        let big: Int64 = 9_000_000_000_000_000_000
        try await connection.execute("INSERT INTO downstream_messages (id, target, payload) VALUES ($1, 'by-hand', '{}')", [.int(big)])
        let after = try await Self.insert(3, on: connection)
        #expect(try await Self.claimAll("w", on: connection) == before + after + [big])
        #expect(try await Self.frontier(database) == after.last, "the frontier stays with the sequence")
        let more = try await Self.insert(2, on: connection)
        #expect(try await Self.claimAll("w", on: connection, sweep: true) == more, "the row in flight is not taken again")
        // Its claim expires (its worker died): its rows are taken over once.
        try await connection.execute("UPDATE outbox_claims SET expires_at = now() - interval '1 second' WHERE $1 = ANY(row_ids)", [.int(big)])
        #expect(try await Self.claimAll("w2", on: connection, sweep: true) == before + after + [big])
        #expect(try await Self.claimAll("w2", on: connection, sweep: true).isEmpty)
    }

    /// A frontier moved by such a row before migration 0011 is reset by the next claim.
    @Test func aFrontierMovedFarAboveTheSequenceIsResetAndTheRowsBelowItAreClaimed() async throws {
        let database = try await TestDatabase.make()
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        let rows = try await Self.insert(4, on: connection)
        try await connection.execute("UPDATE outbox_cursors SET frontier = 9000000000000000000 WHERE transport = 'xmpp'")
        #expect(try await Self.claimAll("w", on: connection) == rows)
        #expect(try await Self.frontier(database) == rows.last)
    }

    /// A row to send without a due time is due now; a row inserted with any other status is
    /// a record, never sent.
    @Test func rowsInsertedWithoutADueTimeAreDueAndRowsInsertedFinishedAreNotSent() async throws {
        let database = try await TestDatabase.make()
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        let ids = try await connection.query("""
            INSERT INTO downstream_messages (target, payload, status, available_at) VALUES
              ('a', '{}', 'pending', NULL), ('b', '{}', 'retry', NULL), ('c', '{}', 'acked', now()),
              ('d', '{}', 'failed', now()), ('e', '{}', 'sent', now())
            RETURNING id
            """).compactMap { $0.int(0) }
        #expect(try await Self.claimAll("w", on: connection) == Array(ids[0..<2]))
        #expect(try await database.count("downstream_messages", where: "available_at IS NULL") == 3)
    }

    /// A receipt arriving after its row's claim is gone counts only for a row that was sent:
    /// after the outbox was emptied and its ids reused, a receipt for an old message would
    /// have marked a new row, never sent, as delivered.
    @Test func aReceiptWithoutAClaimDoesNotMarkARowNeverSent() async throws {
        let database = try await TestDatabase.make()
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        let ids = try await Self.insert(2, on: connection)
        try await connection.execute("UPDATE downstream_messages SET status = 'acked', available_at = NULL WHERE id = $1", [.int(ids[0])])
        let pool = PostgresPool(target: try PostgresConnectionString(database.url), size: 1)
        defer { Task { await pool.close() } }
        let store = OutboxStore(pool: pool, workerID: "w", lease: .seconds(60), transport: "xmpp")
        try await store.write(ids.map { OutboxUpdate(rowID: $0, status: .delivered, deliveredAt: Date()) }, tokens: [])
        #expect(try await database.outboxRow(ids[0])["status"] == "delivered")
        #expect(try await database.outboxRow(ids[1])["status"] == "pending")
        #expect(try await Self.claimAll("w", on: connection) == [ids[1]])
    }

    /// A claim reads the id sequence after it has locked the table, the order in which
    /// `TRUNCATE … RESTART IDENTITY` locks them: a truncate between the two waits, instead of
    /// holding the table while the claim holds the sequence (PostgreSQL then ended one of
    /// them with "deadlock detected", and the operator's TRUNCATE failed while a worker sent).
    @Test func aTruncateDuringAClaimWaitsForItInsteadOfDeadlocking() async throws {
        let database = try await TestDatabase.make()
        let claim = try await database.connect()
        defer { Task { await claim.close() } }
        _ = try await Self.insert(3, on: claim)
        _ = try await claim.execute("BEGIN")
        _ = try await claim.query("SELECT fcm_outbox_sequence_top()")
        let truncate = Task {
            let operatorConnection = try await database.connect()
            defer { Task { await operatorConnection.close() } }
            _ = try await operatorConnection.execute("TRUNCATE downstream_messages RESTART IDENTITY")
        }
        // The truncate queues behind the claim's lock on the table.
        let deadline = ContinuousClock.now + .seconds(10)
        while try await claim.query("""
            SELECT 1 FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation
            WHERE NOT l.granted AND c.relname = 'downstream_messages' AND l.mode = 'AccessExclusiveLock'
            """).isEmpty {
            #expect(ContinuousClock.now < deadline, "the truncate never waited for the claim's table lock")
            if ContinuousClock.now >= deadline { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        // The claim reads the table it holds: without the lock order, this read waits for the
        // truncate, which waits for the claim's sequence lock, and PostgreSQL ends one with 40P01.
        #expect(try await claim.query("SELECT count(*) FROM downstream_messages").first?.int(0) == 3)
        _ = try await claim.execute("COMMIT")
        try await truncate.value
        #expect(try await database.count("downstream_messages") == 0)
    }

    /// The operator's step end to end: the outbox emptied with `TRUNCATE … RESTART IDENTITY`
    /// while a worker sends (the rows after it were never claimed: 0 of 300 sent in 40 s), and
    /// again while no worker runs; then a row given an id far above the sequence, and rows
    /// after it.
    @Test func aWorkerSendsWhatIsQueuedAfterTheOutboxIsEmptiedWhileItRunsAndWhileItIsStopped() async throws {
        let log = DownstreamLog()
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let configuration = try ccs.downstreamWorker(database: database)
        let (task, _) = startWorker(configuration)
        try await ccs.simulator.waitForBoundSessions(1)
        try await database.insertOutbox((0..<100).map { ("before-\($0)", #"{"data":{"k":"v"}}"#) })
        try await database.waitForOutbox("status = 'acked'", count: 100)
        _ = try await database.query("TRUNCATE downstream_messages RESTART IDENTITY")
        try await database.insertOutbox((0..<300).map { ("running-\($0)", #"{"data":{"k":"v"}}"#) })
        try await database.waitForOutbox("status = 'acked'", count: 300)
        task.cancel()
        try await task.value

        _ = try await database.query("TRUNCATE downstream_messages RESTART IDENTITY")
        try await database.insertOutbox((0..<50).map { ("stopped-\($0)", #"{"data":{"k":"v"}}"#) })
        let (next, _) = startWorker(configuration)
        defer { next.cancel() }
        try await database.waitForOutbox("status = 'acked'", count: 50)
        _ = try await database.query("INSERT INTO downstream_messages (id, target, payload) VALUES (9000000000000000000, 'by-hand', '{}')")
        try await database.insertOutbox((0..<20).map { ("after-\($0)", #"{"data":{"k":"v"}}"#) })
        try await database.waitForOutbox("status = 'acked'", count: 71)
        #expect(log.attempts(of: "ds-9000000000000000000").count == 1)
        #expect(log.all.filter { $0.json["to"]?.stringValue?.hasPrefix("after-") == true }.count == 20)
        #expect(ccs.simulator.violations.isEmpty)
    }
}
