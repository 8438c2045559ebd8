import Foundation
import Runtime

/// A token bucket per sender: `burst` messages at once, refilled at `perSecond`. FCM let a
/// device hold 20 upstream messages pending; a device coming back online posts its queue
/// at once, then a trickle. Buckets that are full again are forgotten when the table
/// grows past `trackedSenders`, so memory stays bounded whatever the number of devices.
public final class SenderRateLimit: Sendable {
    private struct Bucket {
        var tokens: Double
        var updated: ContinuousClock.Instant
    }

    public let perSecond: Double
    public let burst: Double
    private let trackedSenders: Int
    private let buckets = BlockingLock<[String: Bucket]>([:])

    public init(perSecond: Double, burst: Int, trackedSenders: Int = 100_000) {
        self.perSecond = perSecond
        self.burst = Double(burst)
        self.trackedSenders = trackedSenders
    }

    /// Takes `count` tokens of `sender`'s bucket (at most `burst`: a batch larger than the
    /// burst empties a full bucket). Returns nil when taken, else how long until they
    /// would be there (for `Retry-After`).
    public func take(_ count: Int, for sender: String, now: ContinuousClock.Instant = .now) -> Duration? {
        let wanted = min(Double(count), burst)
        return buckets.withLock { buckets -> Duration? in
            if buckets.count >= trackedSenders && buckets[sender] == nil { forgetFull(&buckets, now: now) }
            // Found once, and changed where it lies.
            return Self.take(wanted, from: &buckets[sender, default: Bucket(tokens: burst, updated: now)], now: now, perSecond: perSecond,
                             burst: burst)
        }
    }

    private static func take(_ wanted: Double, from bucket: inout Bucket, now: ContinuousClock.Instant, perSecond: Double, burst: Double) -> Duration? {
        let elapsed = now - bucket.updated
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        bucket.tokens = min(burst, bucket.tokens + max(0, seconds) * perSecond)
        bucket.updated = now
        guard bucket.tokens >= wanted else {
            let missing = wanted - bucket.tokens
            return .seconds(perSecond > 0 ? max(1, (missing / perSecond).rounded(.up)) : 60)
        }
        bucket.tokens -= wanted
        return nil
    }

    private func forgetFull(_ buckets: inout [String: Bucket], now: ContinuousClock.Instant) {
        buckets = buckets.filter { _, bucket in
            let elapsed = Double((now - bucket.updated).components.seconds)
            return bucket.tokens + elapsed * perSecond < burst
        }
    }
}
