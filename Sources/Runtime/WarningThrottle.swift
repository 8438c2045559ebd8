/// Which warnings of a recurring kind get logged: the first for each key, then at most one
/// per key and interval, saying how many were left out since. It keeps at most `capacity`
/// keys: keys come from what devices send, and a flood of new ones must not grow it
/// without bound (beyond that, new keys share one entry until old ones age out).
public final class WarningThrottle: Sendable {
    private struct Entry {
        var loggedAt: ContinuousClock.Instant
        var leftOut: Int
    }

    public let interval: Duration
    public let capacity: Int
    private let entries = BlockingLock([String: Entry]())

    public init(interval: Duration = .seconds(60), capacity: Int = 1024) {
        self.interval = interval
        self.capacity = capacity
    }

    /// nil when the warning for `key` is to be left out; otherwise how many were left out
    /// since the last one logged for it (0 for the first).
    public func admit(_ key: String, now: ContinuousClock.Instant = .now) -> Int? {
        entries.withLock { entries in
            var key = key
            if entries[key] == nil, entries.count >= capacity {
                entries = entries.filter { now - $0.value.loggedAt < interval }
                if entries.count >= capacity { key = "" }
            }
            guard let entry = entries[key] else {
                entries[key] = Entry(loggedAt: now, leftOut: 0)
                return 0
            }
            guard now - entry.loggedAt >= interval else {
                entries[key]?.leftOut += 1
                return nil
            }
            entries[key] = Entry(loggedAt: now, leftOut: 0)
            return entry.leftOut
        }
    }
}
