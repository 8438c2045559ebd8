import Runtime
import XMPP

/// When one CCS connection slot connects, reconnects and replaces a connection CCS is
/// draining, as a pure state machine: the shell tells it what happened and does what it
/// answers.
///
/// - A connection that ends, or an attempt that fails, is followed by another after an
///   exponential backoff with full jitter; a connection that stayed up `healthyAfter`
///   starts the backoff again.
/// - `CONNECTION_DRAINING` gets a replacement at once (the draining connection is still
///   read until CCS closes it).
/// - Refused credentials, a refused certificate or an unknown domain stop the slot:
///   retrying cannot fix them. A certificate refused after the slot had a session, though,
///   is an incident (a server's certificate replaced, a man in the middle), not a setting
///   to fix: it is retried with the backoff, and the shell says so as an error each time.
/// - After shutdown, nothing more is started.
public struct CCSConnectionPlan: Sendable {
    public enum Event: Sendable, Equatable {
        case connected(at: ContinuousClock.Instant)
        case connectFailed(XMPPError)
        case draining
        case ended(XMPPError, at: ContinuousClock.Instant)
        case shutdown
    }

    public enum Action: Sendable, Equatable {
        /// Open a connection now.
        case connect
        /// Open a connection after this delay.
        case reconnect(after: Duration)
        /// Read the open connection until it ends or drains.
        case serve
        /// Stop the slot.
        case stop
        /// Stop the slot and report this configuration error.
        case fail(XMPPError)
    }

    private var backoff: Backoff
    private let healthyAfter: Duration
    private var connectedAt: ContinuousClock.Instant?
    private var stopped = false
    /// Whether a session was ever up on this slot.
    private var hadSession = false

    public init(backoff: Backoff = .reconnect(), healthyAfter: Duration = .seconds(60)) {
        self.backoff = backoff
        self.healthyAfter = healthyAfter
    }

    /// Attempts made since the last healthy connection.
    public var attempt: Int { backoff.attempt }

    /// What to do first.
    public func start() -> Action { stopped ? .stop : .connect }

    public mutating func handle<G: RandomNumberGenerator>(_ event: Event, using generator: inout G) -> Action {
        if stopped { return .stop }
        switch event {
        case .shutdown:
            stopped = true
            return .stop
        case .connected(let at):
            connectedAt = at
            hadSession = true
            return .serve
        case .draining:
            connectedAt = nil
            return .connect
        case .connectFailed(let error):
            if error.isConfigurationError && !(hadSession && error.isCertificateRefusal) { return stop(error) }
            return .reconnect(after: backoff.next(using: &generator))
        case .ended(let reason, let at):
            if reason.isConfigurationError { return stop(reason) }
            if let connectedAt, at - connectedAt >= healthyAfter { backoff.reset() }
            connectedAt = nil
            return .reconnect(after: backoff.next(using: &generator))
        }
    }

    public mutating func handle(_ event: Event) -> Action {
        var generator = SystemRandomGenerator()
        return handle(event, using: &generator)
    }

    private mutating func stop(_ error: XMPPError) -> Action {
        stopped = true
        return .fail(error)
    }
}
