import Foundation
import Postgres
import Runtime
import Testing
@testable import Outbox
@testable import Worker

/// The outbox write-back lets answers that come apart share one transaction (a transaction
/// per write costs PostgreSQL far more than a row does), up to its gathering time or
/// until enough rows wait. Its time is a `ManualClock` that only the test moves: nothing is
/// written before the test lets the gathering time pass, however slow the machine, and a
/// write that must not wait for it happens with the clock standing still.
@Suite struct OutboxWriteBackGatheringTests {
    /// A write-back over a fresh outbox holding `rows` rows claimed by this worker, timed by `clock`.
    private func writeBack(rows: Int, gatherTime: Duration, gatherRows: Int = 500, clock: ManualClock) async throws
        -> (OutboxWriteBack, BlockingLock<Int>, [Int64], TestDatabase) {
        let database = try await TestDatabase.make()
        let pool = PostgresPool(target: try PostgresConnectionString(database.url), size: 1)
        let ids = try await database.insertOutbox((0..<rows).map { ("token-\($0)", #"{"data":{"k":"v"}}"#) })
        let store = OutboxStore(pool: pool, workerID: "worker-1", lease: .seconds(60), transport: "xmpp")
        _ = try await store.claim(limit: rows)
        let commits = BlockingLock(0)
        let writeBack = OutboxWriteBack(store: store, logger: Logger(label: "test", minimumLevel: .critical),
                                        gatherTime: gatherTime, gatherRows: gatherRows, clock: clock, onCommit: { commits.withLock { $0 += 1 } })
        return (writeBack, commits, ids, database)
    }

    private func acked(_ id: Int64) -> OutboxUpdate {
        OutboxUpdate(rowID: id, status: .acked, attempts: 1, sentOn: "ccs#1.1", sentAt: Date(), ackedAt: Date())
    }

    /// Lets the writer, woken by an answer, through its first 2 ms and into the gathering wait.
    private func untilGathering(_ writeBack: OutboxWriteBack, _ clock: ManualClock) async throws {
        // Its 2 ms sleep, not the idle wait it may still be in (the clock stands still).
        try await waitUntil("the writer sleeps its first 2 ms") { clock.nextDeadline == clock.now + .milliseconds(2) }
        clock.advance(by: .milliseconds(2))
        try await waitUntil("the writer waits for a batch to gather") { writeBack.isGathering }
    }

    @Test func answersWithinTheGatheringTimeShareOneTransaction() async throws {
        let clock = ManualClock()
        let (writeBack, commits, ids, database) = try await writeBack(rows: 2, gatherTime: .seconds(3), clock: clock)
        let task = Task { await writeBack.run() }
        defer { task.cancel() }
        writeBack.record([acked(ids[0])])
        try await untilGathering(writeBack, clock)
        // A writer that wrote as soon as it woke would have written this one by now.
        #expect(commits.withLock { $0 } == 0, "the first answer was written without waiting for others")
        writeBack.record([acked(ids[1])])
        clock.advance(by: .seconds(3))
        try await waitUntil("the batch written") { commits.withLock { $0 } == 1 && writeBack.backlog == 0 }
        #expect(commits.withLock { $0 } == 1, "both answers went in one transaction")
        #expect(try await database.count("downstream_messages", where: "status = 'acked'") == 2)
    }

    @Test func enoughAnswersForABatchGoWithoutWaitingOutTheGatheringTime() async throws {
        let clock = ManualClock()
        let (writeBack, commits, ids, database) = try await writeBack(rows: 20, gatherTime: .seconds(60), gatherRows: 20, clock: clock)
        let task = Task { await writeBack.run() }
        defer { task.cancel() }
        // Half, so that the writer wakes and waits for more; then the rest, which ends its wait.
        writeBack.record(ids.prefix(10).map(acked))
        try await untilGathering(writeBack, clock)
        #expect(commits.withLock { $0 } == 0, "10 answers of 20 were written without waiting for others")
        writeBack.record(ids.dropFirst(10).map(acked))
        // The clock stands still: only the 20 rows can end the wait.
        try await waitUntil("the batch written") { commits.withLock { $0 } == 1 && writeBack.backlog == 0 }
        #expect(try await database.count("downstream_messages", where: "status = 'acked'") == 20)
    }

    @Test func stoppingEndsTheGatheringAndWritesWhatWaits() async throws {
        let clock = ManualClock()
        let (writeBack, commits, ids, database) = try await writeBack(rows: 2, gatherTime: .seconds(60), clock: clock)
        let task = Task { await writeBack.run() }
        defer { task.cancel() }
        writeBack.record([acked(ids[0])])
        try await untilGathering(writeBack, clock)
        #expect(commits.withLock { $0 } == 0)
        writeBack.stop()
        try await waitUntil("what waited written") { commits.withLock { $0 } == 1 && writeBack.backlog == 0 }
        await task.value
        #expect(try await database.count("downstream_messages", where: "status = 'acked'") == 1)
    }

    @Test func aSentUpdateIsHeldForItsAnswerAndWrittenAloneOnceTheHoldPasses() async throws {
        let clock = ManualClock()
        let (writeBack, commits, ids, database) = try await writeBack(rows: 1, gatherTime: .milliseconds(20), clock: clock)
        let task = Task { await writeBack.run() }
        defer { task.cancel() }
        // Idle first: the writer sleeps until anything comes.
        try await waitUntil("the writer idles") { clock.nextDeadline.map { $0 - clock.now > .seconds(60) } == true }
        let sent = clock.now
        writeBack.record([OutboxUpdate(rowID: ids[0], status: .sent, attempts: 1, sentOn: "ccs#1.1", sentAt: Date())])
        // Woken, the writer waits for the hold (one second) to end: nothing is written before.
        try await waitUntil("the writer waits for the hold") { clock.nextDeadline == sent + .seconds(1) }
        clock.advance(by: .milliseconds(999))
        #expect(commits.withLock { $0 } == 0, "a sent update was written before its hold passed")
        clock.advance(by: .milliseconds(1))
        try await untilGathering(writeBack, clock)
        clock.advance(by: .milliseconds(20))
        try await waitUntil("the sent update written") { commits.withLock { $0 } == 1 }
        #expect(try await database.count("downstream_messages", where: "status = 'sent'") == 1)
    }
}
