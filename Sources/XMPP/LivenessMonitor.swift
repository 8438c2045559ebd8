/// Decides when to ping an idle peer and when to declare it dead. Pure: the caller
/// supplies the clock readings.
///
/// After `idleInterval` with nothing received, it asks for a ping; if still nothing has
/// arrived `timeout` after that ping, the peer is dead. Anything received (a stanza, a pong,
/// a whitespace keepalive) counts as a sign of life. While the reader is paused (its
/// consumer is full, so the socket is not read), the peer's silence says nothing: the
/// monitor stops judging, and starts afresh when reading resumes.
public struct LivenessMonitor: Sendable {
    public enum Action: Sendable, Equatable {
        case sendPing
        case peerDead(silence: Duration)
    }

    public let idleInterval: Duration
    public let timeout: Duration
    private var pingSentAt: ContinuousClock.Instant?
    private var pausedAt: ContinuousClock.Instant?
    private var resumedAt: ContinuousClock.Instant?

    public init(idleInterval: Duration, timeout: Duration) {
        self.idleInterval = idleInterval
        self.timeout = timeout
    }

    /// True while reading is paused.
    public var isPaused: Bool { pausedAt != nil }

    /// Reading stopped at `now` (backpressure): no ping, no verdict until `resume`.
    public mutating func pause(at now: ContinuousClock.Instant) {
        guard pausedAt == nil else { return }
        pausedAt = now
        pingSentAt = nil
    }

    /// Reading resumed at `now`: the idle interval counts from here.
    public mutating func resume(at now: ContinuousClock.Instant) {
        guard pausedAt != nil else { return }
        pausedAt = nil
        resumedAt = now
    }

    /// When `tick` must be called next (nil while paused).
    public func nextDeadline(lastHeard: ContinuousClock.Instant) -> ContinuousClock.Instant? {
        guard pausedAt == nil else { return nil }
        let heard = effective(lastHeard)
        if let pingSentAt, heard <= pingSentAt { return pingSentAt + timeout }
        return heard + idleInterval
    }

    /// What to do at `now`, given when the peer was last heard from.
    public mutating func tick(now: ContinuousClock.Instant, lastHeard: ContinuousClock.Instant) -> Action? {
        guard pausedAt == nil else { return nil }
        let heard = effective(lastHeard)
        if let sent = pingSentAt {
            if heard > sent {
                pingSentAt = nil
            } else if now >= sent + timeout {
                return .peerDead(silence: now - heard)
            } else {
                return nil
            }
        }
        if now >= heard + idleInterval {
            pingSentAt = now
            return .sendPing
        }
        return nil
    }

    /// `lastHeard`, but not before reading last resumed.
    private func effective(_ lastHeard: ContinuousClock.Instant) -> ContinuousClock.Instant {
        guard let resumedAt else { return lastHeard }
        return max(lastHeard, resumedAt)
    }
}
