import Runtime

/// Counts over a sliding window, kept as sixty buckets of a sixtieth of it each: adding is
/// an increment, the total is the last window's (to within a bucket). A pure value.
package struct CountWindow: Sendable {
    package let window: Duration
    private var buckets: [Int]
    private var bucketStart: ContinuousClock.Instant
    private var index = 0
    private static let bucketCount = 60

    package init(window: Duration, now: ContinuousClock.Instant) {
        self.window = window
        buckets = Array(repeating: 0, count: Self.bucketCount)
        bucketStart = now
    }

    private var bucketWidth: Duration { window / Self.bucketCount }

    /// Moves to `now`, emptying the buckets it passes.
    private mutating func advance(to now: ContinuousClock.Instant) {
        guard now - bucketStart >= bucketWidth else { return }
        let passed = Int(((now - bucketStart) / bucketWidth).rounded(.down))
        if passed >= Self.bucketCount {
            for slot in buckets.indices { buckets[slot] = 0 }
            bucketStart = now
            return
        }
        for _ in 0..<passed {
            index = (index + 1) % Self.bucketCount
            buckets[index] = 0
        }
        bucketStart += bucketWidth * passed
    }

    /// Counts one at `now`.
    package mutating func add(at now: ContinuousClock.Instant) {
        advance(to: now)
        buckets[index] += 1
    }

    /// What was counted over the window up to `now`.
    package mutating func total(at now: ContinuousClock.Instant) -> Int {
        advance(to: now)
        return buckets.reduce(0, +)
    }

    /// Forgets every count.
    package mutating func reset(at now: ContinuousClock.Instant) {
        for slot in buckets.indices { buckets[slot] = 0 }
        bucketStart = now
    }
}
