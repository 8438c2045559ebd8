import Foundation
@testable import Runtime
import Synchronization
import Testing

@Suite struct ThreadConditionTests {
    /// A timed wait sleeps until its deadline on the monotonic clock: the waiter wakes a few
    /// times at most (spurious wake-ups), not thousands (a wake-up time computed wrong, in
    /// the past, returns at once and the waiter spins); a deadline already past returns false
    /// at once.
    @Test func aTimedWaitSleepsUntilItsDeadline() {
        let condition = ThreadCondition()
        let deadline = ContinuousClock.now + .milliseconds(30)
        let wakeUps = condition.withLock { () -> Int in
            var wakeUps = 1
            while condition.wait(until: deadline) { wakeUps += 1 }
            return wakeUps
        }
        #expect(wakeUps < 10, "the waiter woke \(wakeUps) times in 30 ms")
        #expect(ContinuousClock.now >= deadline)
        #expect(condition.withLock { condition.wait(until: .now - .seconds(1)) } == false)
    }

    /// A waiter that checks its state holding the mutex never misses a change signalled
    /// holding it, however the two threads interleave: a thousand hand-offs all arrive. Each
    /// wait is bounded, so a missed wake-up fails the test instead of hanging it.
    @Test func aSignalledChangeIsNeverMissed() async {
        let condition = ThreadCondition()
        let handed = Atomic(0)
        let received = Atomic(0)
        let rounds = 1000
        let limit = ContinuousClock.now + .seconds(30)
        let waiter = Thread {
            condition.lock()
            handOffs: while received.load(ordering: .relaxed) < rounds {
                while handed.load(ordering: .relaxed) == received.load(ordering: .relaxed) {
                    guard condition.wait(until: limit) else { break handOffs }
                }
                received.add(1, ordering: .relaxed)
                condition.signal()
            }
            condition.unlock()
        }
        waiter.start()
        for round in 1...rounds {
            let arrived = condition.withLock { () -> Bool in
                handed.store(round, ordering: .relaxed)
                condition.signal()
                while received.load(ordering: .relaxed) < round {
                    guard condition.wait(until: limit) else { return false }
                }
                return true
            }
            guard arrived else { break }
        }
        #expect(received.load(ordering: .relaxed) == rounds)
    }
}
