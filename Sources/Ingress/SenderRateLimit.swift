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

    /// Charges `count` messages to `sender`'s bucket: each costs a token. A request is let
    /// through when the bucket holds as many tokens as it has messages, or (a batch larger
    /// than the burst) when it is full; a batch then leaves the bucket in debt, which its
    /// refill pays back before the sender posts again, so batches reach no more than
    /// `perSecond` over time either. Returns nil when let through, else how long until it
    /// would be (for `Retry-After`).
    public func take(_ count: Int, for sender: String, now: ContinuousClock.Instant = .now) -> Duration? {
        buckets.withLock { buckets -> Duration? in
            if buckets.count >= trackedSenders && buckets[sender] == nil { forgetFull(&buckets, now: now) }
            // Found once, and changed where it lies.
            return Self.take(Double(count), from: &buckets[sender, default: Bucket(tokens: burst, updated: now)], now: now,
                             perSecond: perSecond, burst: burst)
        }
    }

    private static func take(_ count: Double, from bucket: inout Bucket, now: ContinuousClock.Instant, perSecond: Double, burst: Double) -> Duration? {
        let elapsed = now - bucket.updated
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        bucket.tokens = min(burst, bucket.tokens + max(0, seconds) * perSecond)
        bucket.updated = now
        // What must be there: the whole count, or a full bucket for a batch over the burst.
        let needed = min(count, burst)
        guard bucket.tokens >= needed else {
            let missing = needed - bucket.tokens
            return .seconds(perSecond > 0 ? max(1, (missing / perSecond).rounded(.up)) : 60)
        }
        bucket.tokens -= count
        return nil
    }

    private func forgetFull(_ buckets: inout [String: Bucket], now: ContinuousClock.Instant) {
        buckets = buckets.filter { _, bucket in
            let elapsed = Double((now - bucket.updated).components.seconds)
            return bucket.tokens + elapsed * perSecond < burst
        }
    }
}
