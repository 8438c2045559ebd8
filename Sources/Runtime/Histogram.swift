/// Observations counted into fixed buckets (Prometheus's cumulative `le` buckets are
/// derived when exported), with their sum and count. A value type: keep it under the lock
/// of what it measures, or merge per-batch copies into a shared one.
public struct Histogram: Sendable, Equatable {
    /// Upper bounds, ascending; a last, implicit bucket takes the rest (`+Inf`).
    public let bounds: [Double]
    /// Observations per bucket (not cumulative); one more than `bounds`.
    public private(set) var counts: [Int]
    public private(set) var sum: Double = 0
    public private(set) var count = 0

    public init(bounds: [Double]) {
        self.bounds = bounds
        self.counts = Array(repeating: 0, count: bounds.count + 1)
    }

    /// Seconds from 1 ms to 60 s: latencies and durations.
    public static let seconds = Histogram(bounds: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60])
    /// Sizes from 1 to 1,000: messages per batch.
    public static let sizes = Histogram(bounds: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000])

    public mutating func observe(_ value: Double) {
        var index = 0
        while index < bounds.count && value > bounds[index] { index += 1 }
        counts[index] += 1
        sum += value
        count += 1
    }

    /// Adds another histogram's observations (same bounds).
    public mutating func merge(_ other: Histogram) {
        precondition(other.bounds == bounds, "merging histograms of different buckets")
        for index in counts.indices { counts[index] += other.counts[index] }
        sum += other.sum
        count += other.count
    }

    /// The cumulative count at or below each bound, then the total (`+Inf`).
    public var cumulativeCounts: [Int] {
        var running = 0
        return counts.map { running += $0; return running }
    }
}
