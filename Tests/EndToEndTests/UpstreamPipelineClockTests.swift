import Foundation
import Postgres
import Runtime
import Testing
@testable import Upstream
@testable import Worker
import TestSupport

/// Counts each message's handling attempts and fails the first `failures` of each.
private struct FailingFirstHandler: UpstreamHandler {
    struct Refused: Error {}
    let attempts: BlockingLock<[String: Int]>
    let failures: Int
    func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
        let attempt = attempts.withLock { attempts -> Int in
            attempts[message.messageID, default: 0] += 1
            return attempts[message.messageID]!
        }
        if attempt <= failures { throw Refused() }
    }
}

/// The upstream pipeline's lingering and retries on a clock the test moves by hand: what
/// they wait for happens exactly when that clock says, never before, however slow the
/// machine (these were timing tests on the real clock).
@Suite struct UpstreamPipelineClockTests {
    private struct Setup {
        let pipeline: UpstreamPipeline
        let clock: ManualClock
        let committed: BlockingLock<[[String]]>
        let retries: BlockingLock<[Duration]>
        let attempts: BlockingLock<[String: Int]>
        let pool: PostgresPool
    }

    private func setUp(_ database: TestDatabase, failures: Int, configure: (inout PipelineSettings) -> Void) throws -> Setup {
        let clock = ManualClock()
        let committed = BlockingLock<[[String]]>([])
        let retries = BlockingLock<[Duration]>([])
        let attempts = BlockingLock<[String: Int]>([:])
        var handlers = UpstreamHandlers()
        handlers.register("failing-first", FailingFirstHandler(attempts: attempts, failures: failures))
        var settings = PipelineSettings()
        settings.partitions = 1
        configure(&settings)
        let pool = PostgresPool(target: try PostgresConnectionString(database.url), size: 1)
        let pipeline = UpstreamPipeline(
            pool: pool, handlers: handlers, settings: settings, logger: Logger(label: "test", minimumLevel: .critical),
            observer: { event in
                switch event {
                case .committed(let handled, _, _): committed.withLock { $0.append(handled.map(\.0)) }
                case .retryScheduled(_, _, let delay): retries.withLock { $0.append(delay) }
                default: break
                }
            },
            metrics: WorkerMetrics(), clock: clock)
        return Setup(pipeline: pipeline, clock: clock, committed: committed, retries: retries, attempts: attempts, pool: pool)
    }

    private func message(_ id: String) -> UpstreamWork {
        UpstreamWork(kind: .message(UpstreamMessage(from: "phone-\(id)", messageID: id)), ack: .sent)
    }

    @Test func messagesArrivingWithinTheLingerShareOneTransactionCommittedWhenItEnds() async throws {
        let database = try await TestDatabase.make()
        let setup = try setUp(database, failures: 0) { $0.batchLinger = .seconds(2) }
        let running = Task { await setup.pipeline.run() }
        await setup.pipeline.submit([message("close-0")])
        // The lane took the first message and lingers for 2 s of the clock.
        try await waitUntil("the lane lingers") { setup.clock.nextDeadline == setup.clock.now + .seconds(2) }
        for index in 1..<5 { await setup.pipeline.submit([message("close-\(index)")]) }
        setup.clock.advance(by: .milliseconds(1_999))
        // The linger's deadline is still scheduled (had it passed, the clock would have run
        // and dropped it), and nothing committed.
        #expect(setup.clock.scheduledCount == 1, "the linger ended before its 2 s")
        #expect(setup.committed.withLock { $0 }.isEmpty, "committed before the linger ended")
        setup.clock.advance(by: .milliseconds(1))
        try await waitUntil("the batch commits") { !setup.committed.withLock { $0 }.isEmpty }
        #expect(setup.committed.withLock { $0 } == [(0..<5).map { "close-\($0)" }])
        setup.pipeline.close()
        #expect(await running.value.isEmpty)
        await setup.pool.close()
    }

    @Test func aFailedMessageIsTriedAgainWhenItsDelayPassesOnTheClockAndNotBefore() async throws {
        let database = try await TestDatabase.make()
        let setup = try setUp(database, failures: 1) { $0.batchLinger = .zero }
        let running = Task { await setup.pipeline.run() }
        await setup.pipeline.submit([message("flaky")])
        try await waitUntil("its retry is scheduled") { !setup.retries.withLock { $0 }.isEmpty }
        let delay = try #require(setup.retries.withLock { $0.first })
        #expect(delay >= .milliseconds(500) && delay <= .seconds(1), "\(delay)")
        // The lane waits for the retry's due time on the clock.
        try await waitUntil("the lane waits for the retry") { setup.clock.nextDeadline == setup.clock.now + delay }
        setup.clock.advance(by: delay - .milliseconds(1))
        #expect(setup.clock.scheduledCount == 1, "the lane stopped waiting before the retry's delay")
        #expect(setup.attempts.withLock { $0["flaky"] } == 1, "tried again before its delay")
        #expect(setup.committed.withLock { $0 }.isEmpty)
        setup.clock.advance(by: .milliseconds(1))
        try await waitUntil("the retry commits") { !setup.committed.withLock { $0 }.isEmpty }
        #expect(setup.committed.withLock { $0 } == [["flaky"]])
        #expect(setup.attempts.withLock { $0["flaky"] } == 2)
        setup.pipeline.close()
        #expect(await running.value.isEmpty)
        await setup.pool.close()
    }
}
