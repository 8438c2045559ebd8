import Foundation
import Postgres
import Testing
@testable import Outbox
@testable import Upstream
@testable import Worker

/// `bench downstream`'s statement runs do to the outbox what they say they measure: the
/// worker's claim and write-back end every row acked, a lock and a read change no row (the
/// read returns every row), the status update finishes every row in one update, and each of
/// those updates, and the worker's, is HOT (migration 0009).
@Suite struct OutboxDatabaseCostTests {
    @Test func eachStepTakesEveryRowThroughWhatItNames() async throws {
        let database = try await TestDatabase.make()
        for step in OutboxDatabaseCost.allCases {
            // No checkpoint: it would flush the dirty pages of every test running beside this one.
            try await OutboxDatabaseCost.prepare(rows: 250, databaseURL: database.url, checkpoint: false)
            let counted = try await database.query("""
                SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'downstream_messages'::regclass
                """).first
            let before = counted?.int(0) ?? 0, hotBefore = counted?.int(1) ?? 0
            #expect(try await step.run(databaseURL: database.url) == 250, "\(step)")
            switch step {
            case .claimAndWriteBack:
                #expect(try await database.count("downstream_messages", where: """
                    status = 'acked' AND attempts = 1 AND claimed_by = 'bench-floor' AND acked_at IS NOT NULL AND available_at IS NULL
                    """) == 250)
            case .rowLock, .rowRead:
                #expect(try await database.count("downstream_messages", where: "status = 'pending' AND available_at IS NOT NULL") == 250)
            case .statusUpdate:
                #expect(try await database.count("downstream_messages", where: "status = 'acked' AND available_at IS NULL") == 250)
            }
            // One row update a row for the worker's statements (claims name rows without writing them) and for the status update, none for a lock
            // (the counters reach the statistics once a session ends or idles: give them a moment).
            let expected: Int64 = step == .rowLock || step == .rowRead ? 0 : 250
            var updates: Int64 = 0
            var hot: Int64 = 0
            for _ in 0..<40 {
                _ = try await database.query("SELECT pg_stat_clear_snapshot()")
                let counters = try await database.query("""
                    SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'downstream_messages'::regclass
                    """).first
                updates = (counters?.int(0) ?? 0) - before
                hot = (counters?.int(1) ?? 0) - hotBefore
                if updates >= expected { break }
                try await Task.sleep(for: .milliseconds(100))
            }
            #expect(updates == expected, "\(step): \(updates) row updates")
            // No final update needs a new index entry or another page.
            #expect(hot == expected, "\(step): \(hot) of \(updates) updates HOT")
        }
    }
}
