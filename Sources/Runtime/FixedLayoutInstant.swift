/// A `ContinuousClock.Instant` kept as the time since a fixed instant of this process.
///
/// `ContinuousClock.Instant` is not `@frozen`: a struct, enum or tuple that holds one has a
/// layout known only at run time, so each of its copies (into an array, a dictionary, a
/// queue) goes through value witnesses looked up then. Values copied for every message hold
/// this instead: `Duration`, which it wraps, is frozen.
package struct FixedLayoutInstant: Sendable, Hashable, Comparable {
    private let sinceOrigin: Duration

    package init(_ instant: ContinuousClock.Instant) {
        sinceOrigin = instant - Self.origin
    }

    /// The instant it holds.
    package var instant: ContinuousClock.Instant { Self.origin + sinceOrigin }

    package static func < (earlier: FixedLayoutInstant, later: FixedLayoutInstant) -> Bool {
        earlier.sinceOrigin < later.sinceOrigin
    }

    /// The instant the others count from: the first time one was made.
    private static let origin = ContinuousClock.now
}
