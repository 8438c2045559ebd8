/// Targets (a device's token, a topic) held back after FCM said they get too many
/// messages, and until when: what both transports consult before sending.
public struct SlowDowns: Sendable {
    private var until: [String: ContinuousClock.Instant] = [:]

    public init() {}

    /// Holds `target` back until `instant` (a later hold wins).
    public mutating func slowDown(_ target: String, until instant: ContinuousClock.Instant) {
        until[target] = max(instant, until[target] ?? instant)
    }

    /// Until when `target` is held back at `now`, or nil when it may be sent to (an
    /// expired hold is forgotten).
    public mutating func heldUntil(_ target: String, now: ContinuousClock.Instant) -> ContinuousClock.Instant? {
        guard let instant = until[target] else { return nil }
        if instant > now { return instant }
        until[target] = nil
        return nil
    }
}
