import Testing
@testable import Runtime

@Suite struct FixedLayoutInstantTests {
    @Test func anInstantComesBackExactlyAndKeepsItsOrder() {
        let now = ContinuousClock.now
        // Before and after the origin (made on first use), up to far away, to the attosecond.
        let instants = [now - .seconds(86_400 * 365), now - .nanoseconds(1), now, now + .nanoseconds(1),
                        now + .seconds(3) + .milliseconds(250), now + .seconds(86_400 * 365 * 100)]
        let kept = instants.map(FixedLayoutInstant.init)
        #expect(kept.map(\.instant) == instants)
        #expect(kept == kept.sorted())
        #expect(FixedLayoutInstant(now) == FixedLayoutInstant(now))
        #expect(FixedLayoutInstant(now) < FixedLayoutInstant(now + .nanoseconds(1)))
        #expect(Set(kept + kept).count == instants.count)
    }
}
