import Foundation
import Postgres
import Runtime
import Testing
@testable import Outbox
@testable import Worker

/// The outbox write-back lets answers that come apart share one transaction (a transaction
/// per write costs PostgreSQL far more than a row does), up to its gathering time or
/// until enough rows wait. The windows here are long, so that a slow machine cannot
/// change the outcome; still a timing test, run in the quiet pass.
@Suite struct OutboxWriteBackTimingTests {
    /// A write-back over a fresh outbox holding `rows` rows claimed by this worker.
    private func writeBack(rows: Int, gatherTime: Duration, gatherRows: Int = 500) async throws
        -> (OutboxWriteBack, BlockingLock<Int>, [Int64], TestDatabase) {
        let database = try await TestDatabase.make()
        let pool = PostgresPool(target: try PostgresConnectionString(database.url), size: 1)
        let ids = try await database.insertOutbox((0..<rows).map { ("token-\($0)", #"{"data":{"k":"v"}}"#) })
        let store = OutboxStore(pool: pool, workerID: "worker-1", lease: .seconds(60), transport: "xmpp")
        _ = try await store.claim(limit: rows)
        let commits = BlockingLock(0)
        let writeBack = OutboxWriteBack(store: store, logger: Logger(label: "test", minimumLevel: .critical),
                                        gatherTime: gatherTime, gatherRows: gatherRows, onCommit: { commits.withLock { $0 += 1 } })
        return (writeBack, commits, ids, database)
    }

    /// The commits once the last one's callback ran (it follows the flush it completes).
    private func commitsAfterTheLastCallback(_ commits: BlockingLock<Int>) async throws -> Int {
        let deadline = ContinuousClock.now + .seconds(5)
        while commits.withLock({ $0 }) == 0 && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        return commits.withLock { $0 }
    }

    private func acked(_ id: Int64) -> OutboxUpdate {
        OutboxUpdate(rowID: id, status: .acked, attempts: 1, sentOn: "ccs#1.1", sentAt: Date(), ackedAt: Date())
    }

    @Test func answersWithinTheGatheringTimeShareOneTransaction() async throws {
        let (writeBack, commits, ids, database) = try await writeBack(rows: 2, gatherTime: .seconds(3))
        let task = Task { await writeBack.run() }
        defer { task.cancel() }
        writeBack.record([acked(ids[0])])
        try await Task.sleep(for: .milliseconds(300))
        // With a write as soon as the writer woke (the former 2 ms wait), this one is written.
        #expect(commits.withLock { $0 } == 0, "the first answer was written without waiting for others")
        writeBack.record([acked(ids[1])])
        #expect(await writeBack.flushed(within: .seconds(10)))
        #expect(try await commitsAfterTheLastCallback(commits) == 1, "both answers went in one transaction")
        #expect(try await database.count("downstream_messages", where: "status = 'acked'") == 2)
    }

    @Test func enoughAnswersForABatchGoWithoutWaitingOutTheGatheringTime() async throws {
        let (writeBack, commits, ids, database) = try await writeBack(rows: 20, gatherTime: .seconds(60), gatherRows: 20)
        let task = Task { await writeBack.run() }
        defer { task.cancel() }
        // Half, so that the writer wakes and waits for more; then the rest, which ends its wait.
        writeBack.record(ids.prefix(10).map(acked))
        try await waitUntil("the writer waits for a batch to gather") { writeBack.isGathering }
        #expect(commits.withLock { $0 } == 0, "10 answers of 20 were written without waiting for others")
        writeBack.record(ids.dropFirst(10).map(acked))
        #expect(await writeBack.flushed(within: .seconds(10)), "20 answers waited for the 60 s gathering time")
        #expect(try await commitsAfterTheLastCallback(commits) == 1)
        #expect(try await database.count("downstream_messages", where: "status = 'acked'") == 20)
    }

    @Test func stoppingEndsTheGatheringAndWritesWhatWaits() async throws {
        let (writeBack, commits, ids, database) = try await writeBack(rows: 2, gatherTime: .seconds(60))
        let task = Task { await writeBack.run() }
        defer { task.cancel() }
        writeBack.record([acked(ids[0])])
        try await waitUntil("the writer waits for a batch to gather") { writeBack.isGathering }
        #expect(commits.withLock { $0 } == 0)
        writeBack.stop()
        #expect(await writeBack.flushed(within: .seconds(10)), "a stop waited for the 60 s gathering time")
        await task.value
        #expect(try await database.count("downstream_messages", where: "status = 'acked'") == 1)
    }
}
