import Foundation
import Postgres
import Testing
@testable import Outbox
@testable import Upstream
@testable import Worker
import Runtime
import TestSupport

/// Claims per batch (migration 0007): a claim names rows without writing them, takes rows
/// whose transactions commit after it passed their ids, never names a row another live
/// claim names; a sweep takes over expired claims and rows due again; a write counts only
/// under a live claim and deletes the claims it settles, and (migration 0009) as a HOT update.
@Suite struct OutboxClaimTests {
    private static func insert(_ count: Int, on connection: PostgresConnection) async throws -> [Int64] {
        try await connection.query("""
            INSERT INTO downstream_messages (target, payload)
            SELECT 'token-' || g, '{"data":{"n":"1"}}'::jsonb FROM generate_series(1, $1) AS g RETURNING id
            """, [.int(Int64(count))]).compactMap { $0.int(0) }
    }

    private static func claim(_ worker: String, _ limit: Int, on connection: PostgresConnection, sweep: Bool = false,
                              lease: Double = 60) async throws -> (claims: Set<Int64>, ids: [Int64]) {
        let rows = try await connection.query("SELECT * FROM \(sweep ? "fcm_outbox_sweep" : "fcm_outbox_claim")($1, 'xmpp', $2, $3)",
                                               [.text(worker), .int(Int64(limit)), .double(lease)])
        // The functions return their rows in no set order; the worker sorts them by id.
        return (Set(rows.compactMap { $0.int(0) }), rows.compactMap { $0.int(1) }.sorted())
    }

    @Test func aClaimNamesABatchInIdOrderAndLeavesTheRowsUnwritten() async throws {
        let database = try await TestDatabase.make()
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        let ids = try await Self.insert(250, on: connection)
        let first = try await Self.claim("worker-1", 100, on: connection)
        let second = try await Self.claim("worker-2", 100, on: connection)
        #expect(first.ids == Array(ids[0..<100]) && second.ids == Array(ids[100..<200]))
        #expect(first.claims.count == 1 && second.claims.count == 1 && first.claims != second.claims)
        let named = try await database.query("SELECT worker, row_ids FROM outbox_claims ORDER BY id")
        #expect(named.map { $0.string(0) } == ["worker-1", "worker-2"])
        #expect(named.first?.ints(1) == Array(ids[0..<100]))
        #expect(try await database.count("downstream_messages", where: "status = 'pending' AND claimed_by IS NULL") == 250,
                "a claim writes no row")
        #expect(try await database.count("downstream_messages_in_flight") == 200)
        // As status and the metrics show them: the claimed ones sending, the others due.
        #expect(try await database.count("downstream_messages_shown", where: "status = 'sending' AND NOT due") == 200)
        #expect(try await database.count("downstream_messages_shown", where: "status = 'pending' AND due") == 50)
        // Nothing behind the frontier is due and unclaimed: a sweep goes on to fresh rows.
        #expect(try await Self.claim("worker-3", 100, on: connection, sweep: true).ids == Array(ids[200...]))
        #expect(try await Self.claim("worker-3", 100, on: connection).ids.isEmpty)
    }

    /// A claim of more than 200 rows is several claim rows: each row comes back with the
    /// one that names it (found by its position among the sorted ids, migration 0008).
    @Test func eachRowOfALargeClaimComesBackWithTheClaimThatNamesIt() async throws {
        let database = try await TestDatabase.make()
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        let ids = try await Self.insert(450, on: connection)
        let rows = try await connection.query("SELECT claim_id, id FROM fcm_outbox_claim('w', 'xmpp', 1000, 60)")
        #expect(rows.compactMap { $0.int(1) }.sorted() == ids)
        let named = try await database.query("SELECT id, row_ids FROM outbox_claims ORDER BY id")
        #expect(named.map { $0.ints(1)?.count ?? 0 } == [200, 200, 50])
        var claimOf: [Int64: Int64] = [:]
        for claim in named { for row in claim.ints(1) ?? [] { claimOf[row] = claim.int(0) } }
        #expect(rows.allSatisfy { row in row.int(0) != nil && claimOf[row.int(1) ?? -1] == row.int(0) })
    }

    /// A claim reads each fresh row once (migration 0010): the scan that finds the rows
    /// returns them, and the ids between the frontier and the last row found are read again
    /// only when that scan left one out. A row a gap gave comes back whole beside fresh rows.
    @Test func aClaimReadsItsFreshRowsOnceAndReturnsARowOfAGapBesideThem() async throws {
        let database = try await TestDatabase.make()
        let claimer = try await database.connect(), slow = try await database.connect(), fast = try await database.connect()
        defer { Task { await claimer.close(); await slow.close(); await fast.close() } }
        /// Every scan of the outbox so far, by index or not (whatever plan the statistics
        /// of a small table lead to); an inner scan counts once per row it is run for.
        func scans() async throws -> Int64 {
            // The claiming session's counters reach the shared statistics once it idles.
            _ = try await claimer.query("SELECT pg_stat_force_next_flush()")
            _ = try await claimer.query("SELECT 1")
            _ = try await database.query("SELECT pg_stat_clear_snapshot()")
            return try await database.query("""
                SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relid = 'downstream_messages'::regclass
                """).first?.int(0) ?? -1
        }
        let ids = try await Self.insert(50, on: fast)
        let before = try await scans()
        #expect(try await Self.claim("worker-1", 100, on: claimer).ids == ids)
        let afterFirst = try await scans()
        #expect(afterFirst == before + 1, "one scan: no row read again by its id, no range of ids read")

        _ = try await slow.execute("BEGIN")
        let late = try await Self.insert(1, on: slow)
        let early = try await Self.insert(3, on: fast)
        #expect(try await Self.claim("worker-1", 100, on: claimer).ids == early)
        #expect(try await scans() == afterFirst + 2, "an id left out: the ids between are read too")
        _ = try await slow.execute("COMMIT")
        let fresh = try await Self.insert(2, on: fast)
        let rows = try await claimer.query("SELECT claim_id, id, target, payload, attempts FROM fcm_outbox_claim('w', 'xmpp', 100, 60)")
        #expect(rows.compactMap { $0.int(1) }.sorted() == late + fresh)
        #expect(Set(rows.compactMap { $0.int(0) }).count == 1, "one claim names them all")
        #expect(rows.allSatisfy { $0.string(2) == "token-1" || $0.string(2) == "token-2" })
        #expect(rows.allSatisfy { $0.string(3) == #"{"data": {"n": "1"}}"# && $0.int(4) == 0 }, "each row whole")
        let named = try await database.query("SELECT row_ids FROM outbox_claims WHERE id = $1", [.int(rows.first?.int(0) ?? 0)])
        #expect(named.first?.ints(0) == late + fresh)
    }

    @Test func aRowCommittedAfterAClaimPassedItsIdIsTakenByTheNextClaim() async throws {
        let database = try await TestDatabase.make()
        let slow = try await database.connect(), fast = try await database.connect(), claimer = try await database.connect()
        defer { Task { await slow.close(); await fast.close(); await claimer.close() } }
        _ = try await slow.execute("BEGIN")
        let late = try await Self.insert(1, on: slow)
        let early = try await Self.insert(3, on: fast)
        #expect(try await Self.claim("worker-1", 100, on: claimer).ids == early, "the uncommitted row is passed")
        let gaps = try await database.query("SELECT gap_ids FROM outbox_cursors WHERE transport = 'xmpp'").first?.ints(0)
        #expect(gaps == late, "and remembered")
        _ = try await slow.execute("COMMIT")
        #expect(try await Self.claim("worker-1", 100, on: claimer).ids == late, "taken by a claim, without waiting for a sweep")
        // A rolled-back id holds nothing up, and is forgotten once the transactions of its time ended.
        _ = try await slow.execute("BEGIN")
        _ = try await Self.insert(1, on: slow)
        let after = try await Self.insert(2, on: fast)
        #expect(try await Self.claim("worker-1", 100, on: claimer).ids == after)
        _ = try await slow.execute("ROLLBACK")
        // Forgotten once every transaction that was running when it was seen has ended. The
        // cluster is shared with other tests, whose transactions hold the horizon back: each
        // claim must drop every gap whose bound the horizon before it had passed.
        var forgotten = false
        for _ in 0..<150 where !forgotten {
            let stale = try await Self.gapsOutlivingTheirBound(claimingOn: claimer, database: database)
            #expect(stale == 0, "a claim keeps no gap once the transactions that could fill it have ended")
            forgotten = try await database.query("SELECT cardinality(gap_ids) FROM outbox_cursors WHERE transport = 'xmpp'")
                .first?.int(0) == 0
            if !forgotten { try await Task.sleep(for: .milliseconds(100)) }
        }
        // Alone, it is forgotten at the next claims; beside a test that holds a transaction
        // open for 15 s, keeping it is right.
        let heldBack = try await database.query("""
            SELECT bool_and(b.bound >= pg_snapshot_xmin(pg_current_snapshot()))
            FROM outbox_cursors AS o CROSS JOIN LATERAL unnest(o.gap_xmax) AS b(bound) WHERE o.transport = 'xmpp'
            """).first?.bool(0) == true
        #expect(forgotten || heldBack, "the gap is forgotten once the transactions of its time have ended")
    }

    /// Reads the horizon (the oldest transaction running anywhere in the cluster), claims,
    /// and returns how many gaps the claim kept although their bound lies below that horizon.
    private static func gapsOutlivingTheirBound(claimingOn claimer: PostgresConnection, database: TestDatabase) async throws -> Int {
        let horizon = try await claimer.query("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").first?.string(0) ?? "0"
        _ = try await claim("worker-1", 100, on: claimer)
        return Int(try await database.query("""
            SELECT count(*) FROM outbox_cursors AS o CROSS JOIN LATERAL unnest(o.gap_xmax) AS b(bound)
            WHERE o.transport = 'xmpp' AND b.bound < $1::xid8
            """, [.text(horizon)]).first?.int(0) ?? -1)
    }

    /// A row inserted after a claim's transaction began, and committed before the claim read
    /// the rows above the frontier, is due: its available_at (its own transaction's start)
    /// is after the claim's now(), and a claim that judged by now() passed it to a sweep the
    /// worker had no reason to run (CI: a NOTIFY's row and a first attempt waited 20-30 s).
    @Test func aRowCommittedWhileAClaimWaitsForItsTurnIsTakenByThatClaim() async throws {
        let database = try await TestDatabase.make()
        let holder = try await database.connect(), inserter = try await database.connect(), claimer = try await database.connect()
        defer { Task { await holder.close(); await inserter.close(); await claimer.close() } }
        // Another claim's turn: the claims' advisory lock, held.
        _ = try await holder.execute("BEGIN")
        _ = try await holder.query("SELECT pg_advisory_xact_lock(hashtext('fcm_outbox_claim'), hashtext(current_schema() || '/xmpp'))")
        let claimerPID = try await claimer.query("SELECT pg_backend_pid()").first?.int(0) ?? 0
        async let claimed = Self.claim("worker-1", 100, on: claimer)
        try await waitUntil("the claim waits for the lock", within: .seconds(5)) {
            try await holder.query("""
                SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1
                """, [.int(claimerPID)]).first?.bool(0) == true
        }
        let inserted = try await Self.insert(2, on: inserter)
        _ = try await holder.execute("COMMIT")
        #expect(try await claimed.ids == inserted, "taken by the claim that saw them")
        #expect(try await database.count("outbox_due_again") == 0, "not left for a sweep")
    }

    /// Gaps are ranges kept until the transactions that could fill them have ended (migration
    /// 0009), however far the frontier runs ahead: before, only the last 2,000 ids below the
    /// newest row taken were kept, and a row further back waited for the sweep's index.
    @Test func aRowFarBehindTheIdsAClaimPassedIsTakenByTheNextClaimOnceCommitted() async throws {
        let database = try await TestDatabase.make()
        let slow = try await database.connect(), fast = try await database.connect(), claimer = try await database.connect()
        defer { Task { await slow.close(); await fast.close(); await claimer.close() } }
        _ = try await slow.execute("BEGIN")
        let late = try await Self.insert(2, on: slow)
        let early = try await Self.insert(2500, on: fast)
        #expect(try await Self.claim("worker-1", 3000, on: claimer).ids == early, "the uncommitted rows are passed")
        let gaps = try await database.query("SELECT gap_ids, gap_last FROM outbox_cursors WHERE transport = 'xmpp'").first
        #expect(gaps?.ints(0) == [late[0]] && gaps?.ints(1) == [late[1]], "and kept as one range")
        // Other transactions come and go: the range stays while the slow one is open.
        for _ in 0..<3 {
            let more = try await Self.insert(1, on: fast)
            #expect(try await Self.claim("worker-1", 100, on: claimer).ids == more)
        }
        _ = try await slow.execute("COMMIT")
        #expect(try await Self.claim("worker-1", 100, on: claimer).ids == late, "taken by a claim, without a sweep")
        #expect(try await database.query("SELECT cardinality(gap_ids) FROM outbox_cursors WHERE transport = 'xmpp'").first?.int(0) == 0)
    }

    /// Gaps pile up while a transaction stays open anywhere in the cluster: ids rolled back
    /// meanwhile are kept until it ends. Beyond 256 ranges a claim reads them at most every
    /// 250 ms (each range costs a lookup), and a row committed late into one is still taken.
    @Test func manyGapsAreReadAtMostEveryQuarterSecondAndARowCommittedIntoOneIsStillTaken() async throws {
        let database = try await TestDatabase.make()
        let holder = try await database.connect(), slow = try await database.connect()
        let fast = try await database.connect(), claimer = try await database.connect()
        defer { Task { await holder.close(); await slow.close(); await fast.close(); await claimer.close() } }
        func gaps() async throws -> (count: Int, readAt: String?) {
            let row = try await database.query("""
                SELECT cardinality(gap_ids), gaps_read_at::text FROM outbox_cursors WHERE transport = 'xmpp'
                """).first
            return (Int(row?.int(0) ?? -1), row?.string(1))
        }
        // The horizon, held by a transaction with an xid.
        _ = try await holder.execute("BEGIN")
        _ = try await holder.query("SELECT pg_current_xact_id()")
        _ = try await slow.execute("BEGIN")
        let late = try await Self.insert(1, on: slow)
        var committed: [Int64] = []
        for _ in 0..<300 {
            _ = try await fast.execute("BEGIN")
            _ = try await Self.insert(1, on: fast)
            _ = try await fast.execute("ROLLBACK")
            committed += try await Self.insert(1, on: fast)
        }
        #expect(try await Self.claim("worker-1", 1000, on: claimer).ids == committed)
        // The slow transaction's id and the first rolled-back one are one range.
        #expect(try await gaps().count == 300, "the slow transaction's id and 300 rolled-back ones")
        // The first claim that finds many gaps reads them; the next ones within 250 ms do not.
        let secondClaimStarted = ContinuousClock.now
        #expect(try await Self.claim("worker-1", 1000, on: claimer).ids.isEmpty)
        let firstRead = try await gaps().readAt
        #expect(firstRead != nil)
        _ = try await slow.execute("COMMIT")
        let next = try await Self.claim("worker-1", 1000, on: claimer).ids
        let sinceTheRead = ContinuousClock.now - secondClaimStarted
        let secondRead = try await gaps().readAt
        if sinceTheRead < .milliseconds(250) {
            #expect(secondRead == firstRead && next.isEmpty, "read \(sinceTheRead) after the last read: the late row waits")
        } else if secondRead == firstRead {
            #expect(next.isEmpty, "gaps not read: the late row waits")
        } else {
            #expect(next == late, "a slow machine: 250 ms had passed, the gaps were read")
        }
        var taken = next
        for _ in 0..<20 where taken.isEmpty {
            try await Task.sleep(for: .milliseconds(100))
            taken = try await Self.claim("worker-1", 1000, on: claimer).ids
        }
        #expect(taken == late, "taken once the gaps are read again")
        #expect(try await gaps().count == 300, "the rolled-back ids stay while the horizon is held")
        _ = try await holder.execute("ROLLBACK")
    }

    /// Gaps under load: inserters whose transactions commit late or roll back, while a
    /// claimer (every fifth call a sweep) runs all along. Every committed row is claimed
    /// exactly once, no rolled-back id is claimed, and no gap outlives its bound.
    @Test func underConcurrentInsertsRollbacksAndSlowCommitsEveryCommittedRowIsClaimedOnce() async throws {
        let database = try await TestDatabase.make()
        let insertersDone = AtomicFlag(false)
        async let claimed = Self.claim(database, until: insertersDone)
        let inserted = try await withThrowingTaskGroup(of: [Int64].self) { group in
            for inserter in 0..<4 {
                group.addTask {
                    let connection = try await database.connect()
                    var committed: [Int64] = []
                    for round in 0..<40 {
                        _ = try await connection.execute("BEGIN")
                        let ids = try await Self.insert(Int.random(in: 1...8), on: connection)
                        // Some transactions stay open while others commit past them.
                        if (round + inserter) % 5 == 0 { try await Task.sleep(for: .milliseconds(Int.random(in: 5...40))) }
                        if (round * 7 + inserter) % 4 == 0 {
                            _ = try await connection.execute("ROLLBACK")
                        } else {
                            _ = try await connection.execute("COMMIT")
                            committed += ids
                        }
                    }
                    await connection.close()
                    return committed
                }
            }
            var all: [Int64] = []
            for try await ids in group { all += ids }
            return all
        }
        insertersDone.value = true
        let (all, gapsSeen) = try await claimed
        #expect(gapsSeen > 0, "the claims passed ids of open transactions")
        #expect(all.count == Set(all).count, "no row claimed twice")
        #expect(Set(all) == Set(inserted), "every committed row claimed, no rolled-back id")
        // What is left are gaps the cluster's other transactions may still fill (the tests
        // beside this one share it): none whose bound the horizon had passed.
        let claimer = try await database.connect()
        #expect(try await Self.gapsOutlivingTheirBound(claimingOn: claimer, database: database) == 0)
        await claimer.close()
    }

    /// Claims (every fifth call sweeps) until `done` is set and then two calls in a row find
    /// nothing, or 20 s pass: the ids claimed, and after how many calls a gap was kept.
    private static func claim(_ database: TestDatabase, until done: AtomicFlag) async throws -> (ids: [Int64], gapsSeen: Int) {
        let connection = try await database.connect()
        var claimed: [Int64] = []
        var gapsSeen = 0
        var emptyAfterDone = 0
        var call = 0
        let deadline = ContinuousClock.now + .seconds(20)
        while emptyAfterDone < 2 && ContinuousClock.now < deadline {
            call += 1
            let finished = done.value
            let ids = try await claim("claimer", 50, on: connection, sweep: call % 5 == 0).ids
            claimed += ids
            if try await connection.query("SELECT cardinality(gap_ids) > 0 FROM outbox_cursors WHERE transport = 'xmpp'").first?.bool(0) == true {
                gapsSeen += 1
            }
            emptyAfterDone = finished && ids.isEmpty ? emptyAfterDone + 1 : 0
            try await Task.sleep(for: .milliseconds(2))
        }
        await connection.close()
        return (claimed, gapsSeen)
    }

    /// Rows that become visible in a gap beyond what a claim may take, and rows the frontier
    /// passes before they are due, wait in outbox_due_again for a sweep: none is left behind.
    @Test func gapRowsBeyondTheLimitAndRowsNotYetDueAreSweptLater() async throws {
        let database = try await TestDatabase.make()
        let slow = try await database.connect(), fast = try await database.connect()
        defer { Task { await slow.close(); await fast.close() } }
        _ = try await slow.execute("BEGIN")
        let late = try await Self.insert(5, on: slow)
        let scheduled = try await fast.query("""
            INSERT INTO downstream_messages (target, payload, available_at) VALUES ('token-later', '{}', now() + interval '2 seconds')
            RETURNING id
            """).compactMap { $0.int(0) }
        let early = try await Self.insert(1, on: fast)
        #expect(try await Self.claim("worker-1", 100, on: fast).ids == early, "the scheduled row is passed, not taken")
        #expect(try await database.count("outbox_due_again", where: "id = \(scheduled[0])") == 1)
        _ = try await slow.execute("COMMIT")
        #expect(try await Self.claim("worker-1", 2, on: fast).ids == Array(late[0..<2]))
        #expect(try await database.count("outbox_due_again", where: "id = ANY('{\(late[2...].map(String.init).joined(separator: ","))}')") == 3)
        #expect(try await Self.claim("worker-1", 100, on: fast, sweep: true).ids == Array(late[2...]))
        #expect(try await database.count("outbox_due_again", where: "id <> \(scheduled[0])") == 0, "taken entries are gone")
        var swept: [Int64] = []
        for _ in 0..<60 where swept.isEmpty {
            try await Task.sleep(for: .milliseconds(100))
            swept = try await Self.claim("worker-1", 100, on: fast, sweep: true).ids
        }
        #expect(swept == scheduled, "the scheduled row is swept once due")
        #expect(try await database.count("outbox_due_again") == 0)
    }

    /// A row's final answer is a HOT update (migration 0009): nothing the answer changes is
    /// indexed, and the page has room for the new version.
    @Test func aPlainAckIsAHeapOnlyUpdate() async throws {
        let database = try await TestDatabase.make()
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        _ = try await Self.insert(300, on: connection)
        let pool = PostgresPool(target: try PostgresConnectionString(database.url), size: 1)
        let store = OutboxStore(pool: pool, workerID: "worker-1", lease: .seconds(60), transport: "xmpp")
        let claimed = try await store.claim(limit: 300)
        let now = Date()
        try await store.write(claimed.map {
            OutboxUpdate(rowID: $0.id, status: .acked, attempts: 1, sentOn: "ccs#1", sentAt: now, ackedAt: now)
        }, tokens: [])
        await pool.close()
        var counters: (updates: Int64, hot: Int64) = (0, 0)
        for _ in 0..<40 where counters.updates < 300 {
            // The writing session's counters reach the shared statistics once it ends.
            _ = try await database.query("SELECT pg_stat_clear_snapshot()")
            let row = try await database.query("""
                SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'downstream_messages'::regclass
                """).first
            counters = (row?.int(0) ?? 0, row?.int(1) ?? 0)
            if counters.updates < 300 { try await Task.sleep(for: .milliseconds(100)) }
        }
        #expect(counters.updates == 300 && counters.hot == 300, "\(counters.hot) of \(counters.updates) updates HOT")
        #expect(try await database.count("outbox_due_again") == 0, "an answer is not due again")
    }

    @Test func aSweepTakesOverExpiredClaimsAndRowsDueAgainButNoRowOfALiveClaim() async throws {
        let database = try await TestDatabase.make()
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        let ids = try await Self.insert(30, on: connection)
        let crashed = try await Self.claim("crashed", 10, on: connection)
        let alive = try await Self.claim("alive", 10, on: connection)
        let retried = try await Self.claim("retried", 10, on: connection)
        // The third worker settles its batch: one row due again, the rest acked; its claim ends.
        _ = try await connection.execute("""
            UPDATE downstream_messages SET status = CASE WHEN id = $1 THEN 'retry' ELSE 'acked' END,
                available_at = CASE WHEN id = $1 THEN now() - interval '1 hour' END
            WHERE id = ANY($2::bigint[])
            """, [.int(ids[20]), .array(retried.ids.map { .int($0) })])
        _ = try await connection.execute("DELETE FROM outbox_claims WHERE worker = 'retried'")
        _ = try await connection.execute("UPDATE outbox_claims SET expires_at = now() - interval '1 s' WHERE worker = 'crashed'")
        let oldest = try await Self.claim("taker", 1, on: connection, sweep: true)
        #expect(oldest.ids == [ids[20]], "oldest due first")
        let swept = try await Self.claim("taker", 100, on: connection, sweep: true)
        #expect(swept.ids == crashed.ids, "then the expired claim's rows, not the live claim's")
        #expect(try await database.count("outbox_claims", where: "worker = 'crashed'") == 0, "the expired claim is deleted")
        #expect(Set(alive.ids).isDisjoint(with: swept.ids))
    }

    @Test func aWriteCountsOnlyUnderALiveClaimAndDeletesTheClaimsItSettles() async throws {
        let database = try await TestDatabase.make()
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        let ids = try await Self.insert(4, on: connection)
        let pool = PostgresPool(target: try PostgresConnectionString(database.url), size: 1)
        let first = OutboxStore(pool: pool, workerID: "first", lease: .seconds(60), transport: "xmpp")
        let second = OutboxStore(pool: pool, workerID: "second", lease: .seconds(60), transport: "xmpp")
        #expect(try await first.claim(limit: 10).map(\.id) == ids)
        // The first worker's claim expires and the second takes the rows over.
        _ = try await connection.execute("UPDATE outbox_claims SET expires_at = now() - interval '1 s'")
        #expect(try await second.claim(limit: 10, sweeping: true).map(\.id) == ids)
        let now = Date()
        try await first.write([OutboxUpdate(rowID: ids[0], status: .acked, attempts: 1, sentOn: "old", sentAt: now, ackedAt: now)],
                              tokens: [])
        #expect(try await database.count("downstream_messages", where: "status = 'pending'") == 4, "a write after a takeover changes nothing")
        #expect(try await first.renewClaims() == 3, "the lost claim is forgotten at renewal (the acked row had left it)")
        #expect(first.ledger.claimIDs.isEmpty && second.ledger.claimIDs.count == 1)
        // The second worker: a receipt-less sent keeps the claim, a retry leaves it, the last answer ends it.
        try await second.write([OutboxUpdate(rowID: ids[0], status: .sent, attempts: 1, sentOn: "ccs#1", sentAt: now)], tokens: [])
        try await second.write([OutboxUpdate(rowID: ids[1], status: .retry, attempts: 1, availableAt: now)], tokens: [])
        let claim = try await database.query("SELECT row_ids FROM outbox_claims WHERE worker = 'second'")
        #expect(claim.first?.ints(0) == [ids[0], ids[2], ids[3]], "the retry left the claim")
        #expect(try await database.count("downstream_messages", where: "status = 'sent' AND claimed_by = 'second'") == 1)
        try await second.write([ids[0], ids[2], ids[3]].map {
            OutboxUpdate(rowID: $0, status: .acked, attempts: 1, sentOn: "ccs#1", sentAt: now, ackedAt: now)
        }, tokens: [])
        #expect(try await database.count("outbox_claims") == 0, "the write that settled its last rows deleted the claim")
        #expect(try await database.count("downstream_messages", where: """
            status = 'acked' AND claimed_by = 'second' AND sent_on = 'ccs#1' AND attempts = 1 AND available_at IS NULL
            """) == 3)
        // A delivery receipt is written whoever holds the row.
        try await first.write([OutboxUpdate(rowID: ids[2], status: .delivered, deliveredAt: now)], tokens: [])
        #expect(try await database.count("downstream_messages", where: "status = 'delivered'") == 1)
        await pool.close()
    }

    /// Plain acks are written by a statement of their own (`OutboxStore.isPlainAck`); in
    /// one write beside other answers, each row ends as the general statement would leave it.
    @Test func plainAcksBesideOtherAnswersInOneWriteEachEndAsTheGeneralStatementLeavesThem() async throws {
        let database = try await TestDatabase.make()
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        let ids = try await Self.insert(3, on: connection)
        let pool = PostgresPool(target: try PostgresConnectionString(database.url), size: 1)
        let store = OutboxStore(pool: pool, workerID: "w", lease: .seconds(60), transport: "xmpp")
        #expect(try await store.claim(limit: 10).map(\.id) == ids)
        // Times to the microsecond: the plain form sends microseconds, the general one seconds.
        let sent = Date(timeIntervalSince1970: 1_800_000_000.123456)
        let acked = Date(timeIntervalSince1970: 1_800_000_000.373457)
        // The first row's earlier attempt left an error; an ack (plain or not) leaves none.
        _ = try await connection.execute("UPDATE downstream_messages SET error_code = 'SERVICE_UNAVAILABLE', attempts = 1 WHERE id = $1",
                                         [.int(ids[0])])
        let plain = OutboxUpdate(rowID: ids[0], status: .acked, attempts: 2, sentOn: "ccs#2", sentAt: sent, ackedAt: acked)
        #expect(OutboxStore.isPlainAck(plain, claim: 1))
        let canonical = OutboxUpdate(rowID: ids[1], status: .acked, attempts: 1, sentOn: "ccs#1", sentAt: sent, ackedAt: acked,
                                     canonicalToken: "new-token")
        #expect(!OutboxStore.isPlainAck(canonical, claim: 1) && !OutboxStore.isPlainAck(plain, claim: nil))
        let retry = OutboxUpdate(rowID: ids[2], status: .retry, attempts: 1, sentOn: "ccs#1", sentAt: sent,
                                 errorCode: "DEVICE_MESSAGE_RATE_EXCEEDED", availableAt: acked.addingTimeInterval(60))
        try await store.write([plain, canonical, retry], tokens: [])
        let rows = try await database.query("""
            SELECT id, status, attempts, sent_on, extract(epoch FROM sent_at)::float8, extract(epoch FROM acked_at)::float8,
                   error_code, canonical_token, claimed_by, available_at IS NULL
            FROM downstream_messages ORDER BY id
            """)
        #expect(rows.map { $0.string(1) } == ["acked", "acked", "retry"])
        #expect(rows.map { $0.int(2) } == [2, 1, 1])
        #expect(rows.map { $0.string(3) } == ["ccs#2", "ccs#1", "ccs#1"])
        #expect(rows.map { $0.double(4) } == [sent.timeIntervalSince1970, sent.timeIntervalSince1970, sent.timeIntervalSince1970])
        #expect(rows[0].double(5) == acked.timeIntervalSince1970 && rows[1].double(5) == acked.timeIntervalSince1970)
        #expect(rows.map { $0.string(6) } == [nil, nil, "DEVICE_MESSAGE_RATE_EXCEEDED"])
        #expect(rows.map { $0.string(7) } == [nil, "new-token", nil])
        #expect(rows.map { $0.string(8) } == ["w", "w", "w"])
        #expect(rows.map { $0.bool(9) } == [true, true, false])
        await pool.close()
    }

    /// The functions' plans are generic (made once per session): they must find rows through
    /// indexes, never by reading the outbox, which grows with every message until pruned.
    @Test func claimsAndSweepsReadIndexesNotTheWholeTable() async throws {
        let database = try await TestDatabase.make()
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        _ = try await Self.insert(20000, on: connection)
        _ = try await connection.execute("ANALYZE downstream_messages")
        func sequentialScans() async throws -> Int64 {
            // The claiming session's counters reach the shared statistics once it idles.
            _ = try await connection.query("SELECT pg_stat_force_next_flush()")
            _ = try await connection.query("SELECT 1")
            _ = try await database.query("SELECT pg_stat_clear_snapshot()")
            return try await database.query("SELECT seq_scan FROM pg_stat_user_tables WHERE relid = 'downstream_messages'::regclass")
                .first?.int(0) ?? -1
        }
        let before = try await sequentialScans()
        for round in 0..<10 {
            #expect(try await Self.claim("worker-1", 100, on: connection, sweep: round % 2 == 1).ids.count == 100)
        }
        #expect(try await sequentialScans() == before, "no claim or sweep read the whole table")
    }
}

private extension PostgresRow {
    func ints(_ index: Int) -> [Int64]? { strings(index)?.compactMap { Int64($0) } }
}
