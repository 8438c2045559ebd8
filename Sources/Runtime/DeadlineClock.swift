/// The clock the worker's timed waits and sleeps run on: what time it is, and running a
/// short action once a deadline has passed. `DeadlineThread.shared` (the system's monotonic
/// clock) everywhere in production; a `ManualClock` in a test that moves time by hand, so
/// that a timeout or a gathering window is tested without waiting for it, and without a
/// slow machine changing the outcome.
///
/// Instants are `ContinuousClock.Instant`s: a manual clock counts from the instant it was
/// made. Actions must be short and never block (resume a continuation, ring a doorbell).
public protocol DeadlineClock: Sendable {
    /// The current instant on this clock.
    var now: ContinuousClock.Instant { get }
    /// Runs `action` once `deadline` has passed on this clock (at once if it has), unless
    /// `cancel` comes first.
    @discardableResult
    func schedule(at deadline: ContinuousClock.Instant, _ action: @escaping @Sendable () -> Void) -> DeadlineTicket
    /// Keeps the ticket's action from running; true when this call stopped it, false when it
    /// had been cancelled already or has run (or is about to).
    @discardableResult
    func cancel(_ ticket: DeadlineTicket) -> Bool
}

/// Names an action a `DeadlineClock` scheduled, to cancel it.
public struct DeadlineTicket: Sendable, Hashable {
    @usableFromInline let id: UInt64

    @usableFromInline init(id: UInt64) {
        self.id = id
    }
}
