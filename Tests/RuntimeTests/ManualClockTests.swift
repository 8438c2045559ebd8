@testable import Runtime
import Testing

@Suite struct ManualClockTests {
    @Test func actionsRunWhenTheClockIsMovedPastThemInDeadlineOrder() {
        let clock = ManualClock()
        let ran = BlockingLock<[String]>([])
        let start = clock.now
        clock.schedule(at: start + .seconds(3)) { ran.withLock { $0.append("c") } }
        clock.schedule(at: start + .seconds(1)) { ran.withLock { $0.append("a") } }
        let cancelled = clock.schedule(at: start + .seconds(2)) { ran.withLock { $0.append("b") } }
        clock.schedule(at: start - .seconds(1)) { ran.withLock { $0.append("past") } }
        #expect(ran.withLock { $0 } == ["past"], "a deadline already passed runs at once, the others wait")
        #expect(clock.cancel(cancelled) && !clock.cancel(cancelled))
        #expect(clock.nextDeadline == start + .seconds(1))
        clock.advance(by: .milliseconds(999))
        #expect(ran.withLock { $0 } == ["past"])
        clock.advance(by: .seconds(5))
        #expect(ran.withLock { $0 } == ["past", "a", "c"] && clock.scheduledCount == 0)
        #expect(clock.now == start + .milliseconds(5999))
    }

    @Test func aTimedWaitOnAManualClockEndsOnlyWhenTheClockPassesItsDeadline() async throws {
        let clock = ManualClock()
        let gate = BlockingLock(Waiters<String>())
        let waiting = Task {
            await gate.suspend(in: \.self, cancelled: "cancelled", deadline: clock.now + .seconds(30), timedOut: "timed out", clock: clock) { _ in nil }
        }
        while clock.scheduledCount == 0 { await Task.yield() }
        clock.advance(by: .seconds(29))
        #expect(clock.scheduledCount == 1, "still waiting after 29 of its 30 s")
        clock.advance(by: .seconds(1))
        #expect(await waiting.value == "timed out")
        // A sleep on it too, and its cancellation.
        let sleeping = Task { await sleepUnlessCancelled(for: .seconds(3600), clock: clock) }
        while clock.scheduledCount == 0 { await Task.yield() }
        clock.advance(by: .seconds(3600))
        #expect(await sleeping.value)
        let cancelledSleep = Task { await sleepUnlessCancelled(for: .seconds(3600), clock: clock) }
        cancelledSleep.cancel()
        #expect(await !cancelledSleep.value)
    }
}
