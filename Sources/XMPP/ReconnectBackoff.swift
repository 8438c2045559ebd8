/// Delays between reconnect attempts: exponential with full jitter.
///
/// Attempt n (from 0) waits a uniformly random time in [0, min(cap, base × 2ⁿ)], so the
/// first retry comes within `base` (about a second) and a fleet of workers does not
/// reconnect in lockstep. A session that stayed up for `healthyAfter` resets the sequence.
public struct ReconnectBackoff: Sendable {
    public let base: Duration
    public let cap: Duration
    public let healthyAfter: Duration
    public private(set) var attempt = 0

    public init(base: Duration = .seconds(1), cap: Duration = .seconds(60), healthyAfter: Duration = .seconds(60)) {
        self.base = base
        self.cap = cap
        self.healthyAfter = healthyAfter
    }

    /// The upper bound of the next delay.
    public var currentCeiling: Duration {
        let exponent = min(attempt, 30)
        let grown = base * (1 << exponent)
        return min(cap, grown)
    }

    /// The delay before the next attempt, drawing from `generator`; advances the sequence.
    public mutating func nextDelay<G: RandomNumberGenerator>(using generator: inout G) -> Duration {
        let ceiling = currentCeiling
        attempt += 1
        let nanoseconds = ceiling.components.seconds * 1_000_000_000 + ceiling.components.attoseconds / 1_000_000_000
        guard nanoseconds > 0 else { return .zero }
        return .nanoseconds(Int64.random(in: 0...nanoseconds, using: &generator))
    }

    /// The delay before the next attempt, from the system random source.
    public mutating func nextDelay() -> Duration {
        var generator = SystemRandomNumberGenerator()
        return nextDelay(using: &generator)
    }

    /// Tells the policy how long the last session lasted; a healthy one resets it.
    public mutating func sessionEnded(after uptime: Duration) {
        if uptime >= healthyAfter { attempt = 0 }
    }
}
