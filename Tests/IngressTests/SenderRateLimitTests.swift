import Testing
@testable import Ingress

/// Every message is charged: a batch over the burst passes a full bucket and leaves it in
/// debt, so batches reach no more than the rate over time (they used to cost the burst).
@Suite struct SenderRateLimitTests {
    @Test func aBatchIsChargedForEachMessage() {
        let limit = SenderRateLimit(perSecond: 10, burst: 20)
        let start = ContinuousClock.now
        #expect(limit.take(100, for: "s", now: start) == nil, "a full bucket lets a batch of 100 through")
        // 80 in debt: 8 s of refill before the next message.
        #expect(limit.take(1, for: "s", now: start + .seconds(2)) != nil)
        #expect(limit.take(1, for: "s", now: start + .seconds(7)) != nil)
        #expect(limit.take(1, for: "s", now: start + .milliseconds(8200)) == nil)
        // Over 20 s, batches of 100 from the first moment get through at most 3 times:
        // 300 messages, about the 200 of the rate plus a burst and one batch.
        let other = SenderRateLimit(perSecond: 10, burst: 20)
        var passed = 0
        var now = start
        while now < start + .seconds(20) {
            if other.take(100, for: "b", now: now) == nil { passed += 100 }
            now += .milliseconds(100)
        }
        #expect(passed <= 300, "\(passed) messages in 20 s at 10/s")
    }

    @Test func requestsWithinTheBucketPassAndOthersWait() {
        let limit = SenderRateLimit(perSecond: 1, burst: 3)
        let now = ContinuousClock.now
        #expect(limit.take(2, for: "a", now: now) == nil)
        #expect(limit.take(2, for: "a", now: now) == .seconds(1))
        #expect(limit.take(1, for: "a", now: now) == nil)
        #expect(limit.take(1, for: "b", now: now) == nil, "another sender has its own bucket")
    }
}
