import Foundation
@testable import Runtime
import Synchronization
import Testing

@Suite struct ThreadConditionTests {
    /// A timed wait ends, false, no earlier than its deadline on the monotonic clock, and a
    /// deadline already past returns at once.
    @Test func aTimedWaitEndsAtItsDeadlineAndNotBefore() {
        let condition = ThreadCondition()
        let deadline = ContinuousClock.now + .milliseconds(30)
        let ended = condition.withLock { () -> Bool in
            // Spurious wake-ups return true before the deadline: wait again, as waiters do.
            while condition.wait(until: deadline) {}
            return true
        }
        #expect(ended)
        #expect(ContinuousClock.now >= deadline)
        #expect(condition.withLock { condition.wait(until: .now - .seconds(1)) } == false)
    }

    /// A waiter that checks its state holding the mutex never misses a change signalled
    /// holding it, however the two threads interleave: a thousand hand-offs all arrive.
    @Test func aSignalledChangeIsNeverMissed() async {
        let condition = ThreadCondition()
        let handed = Atomic(0)
        let received = Atomic(0)
        let rounds = 1000
        let waiter = Thread {
            condition.lock()
            while received.load(ordering: .relaxed) < rounds {
                while handed.load(ordering: .relaxed) == received.load(ordering: .relaxed) { condition.wait() }
                received.add(1, ordering: .relaxed)
                condition.signal()
            }
            condition.unlock()
        }
        waiter.start()
        for round in 1...rounds {
            condition.withLock {
                handed.store(round, ordering: .relaxed)
                condition.signal()
                while received.load(ordering: .relaxed) < round { condition.wait() }
            }
        }
        #expect(received.load(ordering: .relaxed) == rounds)
    }
}
