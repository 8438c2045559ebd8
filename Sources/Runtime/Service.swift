/// A long-running part of the worker (a connection pool, the upstream pipeline, the outbox):
/// `run(until:)` works until its stage's `stop` is requested, then winds down (finishing or
/// handing back what it holds) and returns.
///
/// Two signals, as in swift-service-lifecycle: `stop` asks for the graceful end, and the
/// service must return within the bound it documents; cancelling the task asks for the end
/// now, and the service must return at once, giving up what it was finishing. A service whose
/// graceful end is to stop at once runs its work under `cancellingOnRequest(stop)`.
package protocol Service: Sendable {
    /// A short name for logs (`pipeline`, `ccs`, `outbox-xmpp`).
    var name: String { get }
    /// Runs until `stop` is requested (or the task is cancelled). Throws only for what
    /// restarting cannot fix (for example refused credentials); that stops the whole group.
    func run(until stop: ShutdownSignal) async throws
}
