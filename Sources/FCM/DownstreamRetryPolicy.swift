import Runtime

/// When a downstream message that FCM could not take is tried again.
///
/// Attempt n (from 1) waits `base × 2ⁿ⁻¹`, capped at `cap`, times a random factor in
/// [0.5, 1.5) so that messages failed together do not return together. A message older
/// than `maximumAge`, or past its own time to live, is not retried.
public struct DownstreamRetryPolicy: Sendable {
    public var base: Duration = .seconds(1)
    public var cap: Duration = .seconds(300)
    public var maximumAge: Duration = .seconds(86_400)

    public init() {}

    /// `base` doubling to `cap`, × [0.5, 1.5).
    public var backoff: Backoff { Backoff(base: base, cap: cap, jitter: .scaled(0.5..<1.5)) }

    public enum Decision: Sendable, Equatable {
        case retry(after: Duration)
        /// Too old (`maximumAge`) or its time to live has passed: mark it expired.
        case giveUp
    }

    /// What to do after failed attempt `attempt` (1 for the first failure) of a message
    /// first queued `age` ago, with `timeToLive` seconds (nil: FCM's 4-week default).
    public func decide<G: RandomNumberGenerator>(attempt: Int, age: Duration, timeToLive: Int?,
                                                 using generator: inout G) -> Decision {
        let delay = backoff.delay(attempt: max(attempt - 1, 0), using: &generator)
        let lifetime = Duration.seconds(timeToLive ?? DownstreamMessage.maximumTimeToLive)
        if age + delay > maximumAge || age + delay > lifetime { return .giveUp }
        return .retry(after: delay)
    }
}
