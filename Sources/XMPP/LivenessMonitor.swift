/// Decides when to ping an idle peer and when to declare it dead. Pure: the caller
/// supplies the clock readings.
///
/// After `idleInterval` with nothing received, it asks for a ping; if still nothing has
/// arrived `timeout` after that ping, the peer is dead. Anything received (a stanza, a pong,
/// a whitespace keepalive) counts as a sign of life.
public struct LivenessMonitor: Sendable {
    public enum Action: Sendable, Equatable {
        case sendPing
        case peerDead(silence: Duration)
    }

    public let idleInterval: Duration
    public let timeout: Duration
    private var pingSentAt: ContinuousClock.Instant?

    public init(idleInterval: Duration, timeout: Duration) {
        self.idleInterval = idleInterval
        self.timeout = timeout
    }

    /// When `tick` must be called next.
    public func nextDeadline(lastHeard: ContinuousClock.Instant) -> ContinuousClock.Instant {
        if let pingSentAt, lastHeard <= pingSentAt { return pingSentAt + timeout }
        return lastHeard + idleInterval
    }

    /// What to do at `now`, given when the peer was last heard from.
    public mutating func tick(now: ContinuousClock.Instant, lastHeard: ContinuousClock.Instant) -> Action? {
        if let sent = pingSentAt {
            if lastHeard > sent {
                pingSentAt = nil
            } else if now >= sent + timeout {
                return .peerDead(silence: now - lastHeard)
            } else {
                return nil
            }
        }
        if now >= lastHeard + idleInterval {
            pingSentAt = now
            return .sendPing
        }
        return nil
    }
}
