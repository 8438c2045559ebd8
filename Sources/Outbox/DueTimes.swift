import Runtime

/// Instants at which outbox rows fall due again, each with the number of the write-back
/// `record` call that schedules it: an instant is forgotten only once it has passed and
/// that write is committed (before then, a claim could not see the row as due). Kept
/// sorted, at a 5 ms granularity, so a burst of retries scheduled together is one entry.
package struct DueTimes {
    private var entries: [(at: ContinuousClock.Instant, written: UInt64)] = []

    package mutating func insert(_ instant: ContinuousClock.Instant, written: UInt64) {
        var low = 0, high = entries.count
        while low < high {
            let middle = (low + high) / 2
            if entries[middle].at < instant { low = middle + 1 } else { high = middle }
        }
        for neighbour in [low - 1, low] where entries.indices.contains(neighbour) {
            let gap = entries[neighbour].at - instant
            if gap < .milliseconds(5) && gap > .milliseconds(-5) {
                // The later of the two: at the earlier one the other row is not due yet, and
                // only the sweep this wakes would find it.
                entries[neighbour].at = max(entries[neighbour].at, instant)
                entries[neighbour].written = max(entries[neighbour].written, written)
                return
            }
        }
        entries.insert((instant, written), at: low)
    }

    /// Whether an instant has passed by `now` (whatever its write): a sweep is wanted once
    /// that write commits.
    package func hasPassed(by now: ContinuousClock.Instant) -> Bool {
        entries.first.map { $0.at <= now } ?? false
    }

    /// Forgets the instants that have passed by `now` and whose write is committed
    /// (`written` or lower): whether there were any, and the next instant still kept.
    package mutating func popPassed(before now: ContinuousClock.Instant, written committed: UInt64) -> (passed: Bool, next: ContinuousClock.Instant?) {
        var passed = false
        while let first = entries.first, first.at <= now, first.written <= committed {
            entries.removeFirst()
            passed = true
        }
        return (passed, entries.first?.at)
    }
}
