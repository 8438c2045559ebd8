@testable import Runtime
import Synchronization
import Testing
import TestSupport

@Suite struct DeadlineThreadTests {
    /// Records what ran, and when.
    private final class Log: Sendable {
        private let entries = BlockingLock<[(name: String, at: ContinuousClock.Instant)]>([])
        func add(_ name: String) { entries.withLock { $0.append((name, .now)) } }
        var names: [String] { entries.withLock { $0.map(\.name) } }
        func time(of name: String) -> ContinuousClock.Instant? { entries.withLock { $0.first { $0.name == name }?.at } }
    }


    @Test func actionsRunInDeadlineOrderAndNeverEarly() async throws {
        let thread = DeadlineThread(name: "test-deadlines")
        let log = Log()
        let start = ContinuousClock.now
        let deadlines = ["c": start + .milliseconds(60), "a": start + .milliseconds(20), "b": start + .milliseconds(40)]
        for name in ["c", "a", "b"] { thread.schedule(at: deadlines[name]!) { log.add(name) } }
        thread.schedule(at: start - .seconds(1)) { log.add("past") }
        try await waitUntil("all four ran", every: .milliseconds(1)) { log.names.count == 4 }
        #expect(log.names == ["past", "a", "b", "c"])
        for (name, deadline) in deadlines { #expect(log.time(of: name)! >= deadline) }
        #expect(thread.scheduledCount == 0)
    }

    @Test func anEarlierDeadlineWakesTheThreadAsleepUntilALaterOne() async throws {
        let thread = DeadlineThread(name: "test-deadlines")
        let log = Log()
        thread.schedule(at: .now + .seconds(3600)) { log.add("in an hour") }
        try await waitUntil("the thread sleeps until the hour's deadline", every: .milliseconds(1)) { thread.isAsleep }
        thread.schedule(at: .now + .milliseconds(10)) { log.add("soon") }
        // Without the wakeup it would run only in an hour.
        try await waitUntil("the earlier action ran", every: .milliseconds(1)) { log.names == ["soon"] }
    }

    @Test func aCancelledActionNeverRuns() async throws {
        let thread = DeadlineThread(name: "test-deadlines")
        let log = Log()
        // Deadlines far enough off that a busy machine cannot let the first pass before the
        // cancel (that would fail the test for the wrong reason).
        let cancelled = thread.schedule(at: .now + .milliseconds(300)) { log.add("cancelled") }
        let kept = thread.schedule(at: .now + .milliseconds(600)) { log.add("kept") }
        #expect(thread.cancel(cancelled))
        try await waitUntil("the kept action ran", every: .milliseconds(1)) { log.names.contains("kept") }
        #expect(log.names == ["kept"])
        #expect(!thread.cancel(kept), "an action that ran can no longer be cancelled")
        #expect(!thread.cancel(cancelled), "nor one cancelled already")
    }

    @Test func waitsCancelledLongBeforeTheirDeadlineDoNotPileUp() {
        let thread = DeadlineThread(name: "test-deadlines")
        thread.schedule(at: .now + .seconds(3600)) {}
        for _ in 0..<10_000 {
            thread.cancel(thread.schedule(at: .now + .seconds(3600)) {})
        }
        #expect(thread.scheduledCount == 1)
        #expect(thread.storedCount <= 130, "the heap keeps \(thread.storedCount) entries for 1 live one")
    }

    @Test func aSleepEndsAfterItsDurationOrAtOnceWhenCancelled() async throws {
        let start = ContinuousClock.now
        #expect(await sleepUnlessCancelled(for: .milliseconds(20)))
        #expect(ContinuousClock.now - start >= .milliseconds(20))

        let slept = Atomic(0)   // 0 while sleeping, then 1 (slept) or 2 (cancelled)
        let sleeper = Task { slept.store(await sleepUnlessCancelled(for: .seconds(3600)) ? 1 : 2, ordering: .relaxed) }
        // Some timed wait (perhaps another test's): the sleeper may be cancelled before it
        // sleeps, which it must answer at once as well.
        try await waitUntil("the sleep is timed", every: .milliseconds(1)) { DeadlineThread.shared.scheduledCount > 0 }
        sleeper.cancel()
        try await waitUntil("the cancelled sleep ended", every: .milliseconds(1)) { slept.load(ordering: .relaxed) != 0 }
        #expect(slept.load(ordering: .relaxed) == 2)
        await sleeper.value

        let alreadyCancelled = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return await sleepUnlessCancelled(for: .seconds(3600))
        }
        #expect(await alreadyCancelled.value == false)
    }

    @Test func aTimedWaitEndsAtItsDeadlineOrWhenRung() async throws {
        let doorbell = Doorbell()
        let start = ContinuousClock.now
        await doorbell.wait(timeout: .milliseconds(20))
        #expect(ContinuousClock.now - start >= .milliseconds(20))

        let ended = Atomic(false)
        let waiter = Task {
            await doorbell.wait(timeout: .seconds(3600))
            ended.store(true, ordering: .relaxed)
        }
        try await waitUntil("the wait is timed", every: .milliseconds(1)) { DeadlineThread.shared.scheduledCount > 0 }
        doorbell.ring()
        try await waitUntil("the rung wait ended, an hour before its deadline", every: .milliseconds(1)) { ended.load(ordering: .relaxed) }
        await waiter.value
    }
}
