@testable import Runtime
import Testing

@Suite struct BackoffTests {
    @Test func delaysGrowExponentiallyWithFullJitterUpToTheCap() {
        var backoff = Backoff.reconnect(base: .seconds(1), cap: .seconds(8))
        var generator = SystemRandomGenerator()
        let ceilings: [Duration] = [.seconds(1), .seconds(2), .seconds(4), .seconds(8), .seconds(8), .seconds(8)]
        for ceiling in ceilings {
            #expect(backoff.currentCeiling == ceiling)
            let delay = backoff.next(using: &generator)
            #expect(delay >= .zero && delay <= ceiling)
        }
    }

    @Test func jitterSpreadsAcrossTheWholeRange() {
        var generator = SystemRandomGenerator()
        var delays: [Duration] = []
        for _ in 0..<200 {
            var backoff = Backoff.reconnect(base: .seconds(1))
            delays.append(backoff.next(using: &generator))
        }
        // Full jitter: both halves of [0, 1 s] are used.
        #expect(delays.contains { $0 < .milliseconds(500) })
        #expect(delays.contains { $0 > .milliseconds(500) })
    }

    @Test func aResetStartsTheSequenceAgain() {
        var backoff = Backoff.reconnect(base: .seconds(1), cap: .seconds(60))
        _ = backoff.next(); _ = backoff.next(); _ = backoff.next()
        #expect(backoff.currentCeiling == .seconds(8))
        backoff.reset()
        #expect(backoff.currentCeiling == .seconds(1))
    }

    @Test func eachJitterDrawsWithinItsRange() {
        var generator = SystemRandomGenerator()
        for attempt in 0..<8 {
            let ceiling = Backoff.outage(base: .milliseconds(250), cap: .seconds(10)).ceiling(forAttempt: attempt)
            #expect(Backoff.outage(base: .milliseconds(250), cap: .seconds(10)).delay(attempt: attempt, using: &generator) == ceiling)
            let scaled = Backoff(base: .seconds(1), cap: .seconds(300), jitter: .scaled(0.5..<1.5)).delay(attempt: attempt, using: &generator)
            let scaledCeiling = Backoff(base: .seconds(1), cap: .seconds(300), jitter: .none).ceiling(forAttempt: attempt)
            #expect(scaled >= scaledCeiling * 0.5 && scaled < scaledCeiling * 1.5)
        }
        #expect(Backoff.outage().ceiling(forAttempt: 10) == .seconds(10))
    }
}
