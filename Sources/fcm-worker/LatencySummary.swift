import Foundation

/// p50 / p99 / p99.9 / max of a set of latencies.
struct LatencySummary: CustomStringConvertible {
    let sorted: [UInt32]

    init(microseconds: [UInt32]) {
        sorted = microseconds.sorted()
    }

    /// The percentile in milliseconds (NaN without samples).
    func percentile(_ p: Double) -> Double {
        sorted.isEmpty ? .nan : Double(microseconds(p)) / 1000
    }

    /// The percentile in whole microseconds (0 without samples).
    func microseconds(_ p: Double) -> UInt32 {
        guard !sorted.isEmpty else { return 0 }
        let index = min(sorted.count - 1, Int((p / 100 * Double(sorted.count)).rounded(.up)) - 1)
        return sorted[max(0, index)]
    }

    var description: String {
        guard !sorted.isEmpty else { return "no samples" }
        return String(format: "p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms, max %.1f ms (%d samples)",
                      percentile(50), percentile(99), percentile(99.9), Double(sorted.last!) / 1000, sorted.count)
    }
}

