/// Exponential backoff with jitter: the one policy behind every retry loop of the worker
/// (reconnects, database outages, failing handlers, downstream retries, HTTP requests).
///
/// Attempt n (from 0) has the ceiling `min(cap, base × 2ⁿ)`; the delay drawn for it is that
/// ceiling scaled by `jitter`. A caller that keeps no state (a retry counted in a database
/// row) asks `delay(attempt:using:)`; a loop keeps a `Backoff` and calls `next()`, then
/// `reset()` after a success.
public struct Backoff: Sendable, Equatable {
    /// How a delay is drawn from the attempt's ceiling.
    public enum Jitter: Sendable, Equatable {
        /// Exactly the ceiling.
        case none
        /// Uniform in [0, ceiling]: a fleet of workers never retries in lockstep.
        case full
        /// The ceiling × a factor drawn uniformly from `range` (for example 0.5..<1.5).
        case scaled(Range<Double>)
        /// The ceiling × a factor drawn uniformly from `range` (for example 0.5...1.0).
        case scaledClosed(ClosedRange<Double>)
    }

    public let base: Duration
    public let cap: Duration
    public let jitter: Jitter
    /// Attempts so far (the next delay is for this attempt number).
    public private(set) var attempt = 0

    public init(base: Duration, cap: Duration, jitter: Jitter) {
        self.base = base
        self.cap = cap
        self.jitter = jitter
    }

    /// `min(cap, base × 2ⁿ)` for attempt n (from 0).
    public func ceiling(forAttempt n: Int) -> Duration {
        min(cap, base * (1 << min(max(n, 0), 30)))
    }

    /// The upper bound of the next delay.
    public var currentCeiling: Duration { ceiling(forAttempt: attempt) }

    /// The delay for attempt n (from 0), drawn from `generator`, without advancing anything.
    public func delay<G: RandomNumberGenerator>(attempt n: Int, using generator: inout G) -> Duration {
        let ceiling = ceiling(forAttempt: n)
        switch jitter {
        case .none:
            return ceiling
        case .full:
            let nanoseconds = ceiling.components.seconds * 1_000_000_000 + ceiling.components.attoseconds / 1_000_000_000
            guard nanoseconds > 0 else { return .zero }
            return .nanoseconds(Int64.random(in: 0...nanoseconds, using: &generator))
        case .scaled(let range):
            return ceiling * Double.random(in: range, using: &generator)
        case .scaledClosed(let range):
            return ceiling * Double.random(in: range, using: &generator)
        }
    }

    /// The delay for attempt n (from 0), from the system random source.
    public func delay(attempt n: Int) -> Duration {
        var generator = SystemRandomGenerator()
        return delay(attempt: n, using: &generator)
    }

    /// The delay before the next attempt, drawing from `generator`; advances the sequence.
    public mutating func next<G: RandomNumberGenerator>(using generator: inout G) -> Duration {
        defer { attempt += 1 }
        return delay(attempt: attempt, using: &generator)
    }

    /// The delay before the next attempt, from the system random source; advances the sequence.
    public mutating func next() -> Duration {
        var generator = SystemRandomGenerator()
        return next(using: &generator)
    }

    /// Starts the sequence again (after a success).
    public mutating func reset() { attempt = 0 }

    /// Delays between reconnect attempts: full jitter from `base` doubling to `cap`.
    public static func reconnect(base: Duration = .seconds(1), cap: Duration = .seconds(60)) -> Backoff {
        Backoff(base: base, cap: cap, jitter: .full)
    }

    /// Waits while a dependency (the database, a listener) is unreachable: `base` doubling
    /// to `cap`, without jitter (one process, one dependency).
    public static func outage(base: Duration = .milliseconds(250), cap: Duration = .seconds(10)) -> Backoff {
        Backoff(base: base, cap: cap, jitter: .none)
    }
}
