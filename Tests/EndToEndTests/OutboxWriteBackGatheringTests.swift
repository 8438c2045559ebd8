import Foundation
import Postgres
import Runtime
import Testing
@testable import Outbox
@testable import Upstream
@testable import Worker
import TestSupport

/// The outbox write-back lets answers that come apart share one transaction (a transaction
/// per write costs PostgreSQL far more than a row does), up to its gathering time or
/// until enough rows wait. Its time is a `ManualClock` that only the test moves: nothing is
/// written before the test lets the gathering time pass, however slow the machine, and a
/// write that must not wait for it happens with the clock standing still.
@Suite struct OutboxWriteBackGatheringTests {
    /// A running write-back, its manual clock, its commits so far, the rows it may write and
    /// their database.
    private struct Setup {
        let writeBack: OutboxWriteBack
        let clock: ManualClock
        let commits: BlockingLock<Int>
        let ids: [Int64]
        let database: TestDatabase
        let running: Task<Void, Never>
    }

    /// A write-back, running on a `ManualClock`, over a fresh outbox holding `rows` rows
    /// claimed by this worker.
    private func writeBack(rows: Int, gatherTime: Duration, gatherRows: Int = 500) async throws -> Setup {
        let clock = ManualClock()
        let database = try await TestDatabase.make()
        let pool = PostgresPool(target: try PostgresConnectionString(database.url), size: 1)
        let ids = try await database.insertOutbox((0..<rows).map { ("token-\($0)", #"{"data":{"k":"v"}}"#) })
        let store = OutboxStore(pool: pool, workerID: "worker-1", lease: .seconds(60), transport: "xmpp")
        _ = try await store.claim(limit: rows)
        let commits = BlockingLock(0)
        let writeBack = OutboxWriteBack(store: store, logger: Logger(label: "test", minimumLevel: .critical),
                                        gatherTime: gatherTime, gatherRows: gatherRows, clock: clock, onCommit: { commits.withLock { $0 += 1 } })
        let running = Task { await writeBack.run() }
        return Setup(writeBack: writeBack, clock: clock, commits: commits, ids: ids, database: database, running: running)
    }

    private func acked(_ id: Int64) -> OutboxUpdate {
        OutboxUpdate(rowID: id, status: .acked, attempts: 1, sentOn: "ccs#1.1", sentAt: Date(), ackedAt: Date())
    }

    /// Lets the writer, woken by an answer, through its first 2 ms and into the gathering wait.
    private func untilGathering(_ setup: Setup) async throws {
        let clock = setup.clock
        // Its 2 ms sleep, not the idle wait it may still be in (the clock stands still).
        try await waitUntil("the writer sleeps its first 2 ms") { clock.nextDeadline == clock.now + .milliseconds(2) }
        clock.advance(by: .milliseconds(2))
        try await waitUntil("the writer waits for a batch to gather") { setup.writeBack.isGathering }
    }

    @Test func answersWithinTheGatheringTimeShareOneTransaction() async throws {
        let setup = try await writeBack(rows: 2, gatherTime: .seconds(3))
        defer { setup.running.cancel() }
        setup.writeBack.record([acked(setup.ids[0])])
        try await untilGathering(setup)
        // A writer that wrote as soon as it woke would have written this one by now.
        #expect(setup.commits.withLock { $0 } == 0, "the first answer was written without waiting for others")
        setup.writeBack.record([acked(setup.ids[1])])
        setup.clock.advance(by: .seconds(3))
        try await waitUntil("the batch written") { setup.commits.withLock { $0 } == 1 && setup.writeBack.backlog == 0 }
        #expect(setup.commits.withLock { $0 } == 1, "both answers went in one transaction")
        #expect(try await setup.database.count("downstream_messages", where: "status = 'acked'") == 2)
    }

    @Test func enoughAnswersForABatchGoWithoutWaitingOutTheGatheringTime() async throws {
        let setup = try await writeBack(rows: 20, gatherTime: .seconds(60), gatherRows: 20)
        defer { setup.running.cancel() }
        // Half, so that the writer wakes and waits for more; then the rest, which ends its wait.
        setup.writeBack.record(setup.ids.prefix(10).map(acked))
        try await untilGathering(setup)
        #expect(setup.commits.withLock { $0 } == 0, "10 answers of 20 were written without waiting for others")
        setup.writeBack.record(setup.ids.dropFirst(10).map(acked))
        // The clock stands still: only the 20 rows can end the wait.
        try await waitUntil("the batch written") { setup.commits.withLock { $0 } == 1 && setup.writeBack.backlog == 0 }
        #expect(try await setup.database.count("downstream_messages", where: "status = 'acked'") == 20)
    }

    @Test func stoppingEndsTheGatheringAndWritesWhatWaits() async throws {
        let setup = try await writeBack(rows: 2, gatherTime: .seconds(60))
        defer { setup.running.cancel() }
        setup.writeBack.record([acked(setup.ids[0])])
        try await untilGathering(setup)
        #expect(setup.commits.withLock { $0 } == 0)
        setup.writeBack.stop()
        try await waitUntil("what waited written") { setup.commits.withLock { $0 } == 1 && setup.writeBack.backlog == 0 }
        await setup.running.value
        #expect(try await setup.database.count("downstream_messages", where: "status = 'acked'") == 1)
    }

    @Test func aSentUpdateIsHeldForItsAnswerAndWrittenAloneOnceTheHoldPasses() async throws {
        let setup = try await writeBack(rows: 1, gatherTime: .milliseconds(20))
        defer { setup.running.cancel() }
        // Idle first: the writer sleeps until anything comes.
        try await waitUntil("the writer idles") { setup.clock.nextDeadline.map { $0 - setup.clock.now > .seconds(60) } == true }
        let sent = setup.clock.now
        setup.writeBack.record([OutboxUpdate(rowID: setup.ids[0], status: .sent, attempts: 1, sentOn: "ccs#1.1", sentAt: Date())])
        // Woken, the writer waits for the hold (one second) to end: nothing is written before.
        try await waitUntil("the writer waits for the hold") { setup.clock.nextDeadline == sent + .seconds(1) }
        setup.clock.advance(by: .milliseconds(999))
        #expect(setup.clock.nextDeadline == sent + .seconds(1), "the hold ended before its second")
        #expect(setup.commits.withLock { $0 } == 0, "a sent update was written before its hold passed")
        setup.clock.advance(by: .milliseconds(1))
        try await untilGathering(setup)
        setup.clock.advance(by: .milliseconds(20))
        try await waitUntil("the sent update written") { setup.commits.withLock { $0 } == 1 }
        #expect(try await setup.database.count("downstream_messages", where: "status = 'sent'") == 1)
    }
}
