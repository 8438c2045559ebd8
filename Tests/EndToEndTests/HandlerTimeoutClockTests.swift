import Foundation
import Postgres
import Runtime
import Testing
@testable import Upstream
@testable import Worker
import TestSupport

/// Waits for its own cancellation (a handler stuck on something that never answers), then
/// says how it ended.
private struct StuckHandler: UpstreamHandler {
    let ended: BlockingLock<String?>
    func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
        let slept = await sleepUnlessCancelled(for: .seconds(86_400))
        ended.withLock { $0 = slept ? "slept a day" : "cancelled" }
    }
}

/// A handler's timeout on a clock the test moves by hand: cancelled exactly when its limit
/// passes on that clock, and not a moment before, however slow the machine.
@Suite struct HandlerTimeoutClockTests {
    @Test func aHandlerIsCancelledWhenItsTimeoutPassesOnTheClockAndNotBefore() async throws {
        let database = try await TestDatabase.make()
        let connection = try await database.connect()
        let clock = ManualClock()
        let ended = BlockingLock<String?>(nil)
        var handlers = UpstreamHandlers()
        handlers.register("stuck", StuckHandler(ended: ended), timeout: .seconds(30))
        let dispatcher = UpstreamDispatcher(handlers: handlers, logger: Logger(label: "test", minimumLevel: .critical),
                                            metrics: WorkerMetrics(), clock: clock)
        let transaction = UpstreamTransaction(connection: connection)
        let handling = Task {
            try await dispatcher.handle([UpstreamMessage(from: "phone-1", messageID: "m1")], in: transaction, batchingSingles: false)
        }
        try await waitUntil("the handler's deadline is set") { clock.scheduledCount == 1 }
        clock.advance(by: .seconds(29))
        // Its deadline is still scheduled (had it passed, the clock would have run and dropped
        // it): the handler was not stopped before its 30 s.
        #expect(clock.scheduledCount == 1, "the handler's deadline passed before its 30 s")
        #expect(ended.withLock { $0 } == nil, "the handler was stopped before its 30 s")
        clock.advance(by: .seconds(1))
        let failure = await #expect(throws: UpstreamDispatcher.HandlerFailure.self) { try await handling.value }
        #expect(failure?.error is UpstreamDispatcher.Timeout, "\(String(describing: failure))")
        #expect(ended.withLock { $0 } == "cancelled")
        await connection.close()
    }
}
