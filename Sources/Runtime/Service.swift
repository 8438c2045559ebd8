/// A long-running part of the worker (a connection pool, the upstream pipeline, an outbox
/// sender): `run()` works until its task is cancelled, then winds down (finishing or
/// handing back what it holds) and returns.
///
/// Cancelling `run()` is how a service is told to stop; it must return soon after,
/// within the bound it documents, and never wait on anything that cancellation does not
/// end.
public protocol Service: Sendable {
    /// A short name for logs (`pipeline`, `ccs`, `outbox-xmpp`).
    var name: String { get }
    /// Runs until cancelled. Throws only for what restarting cannot fix (for example
    /// refused credentials); that stops the whole group.
    func run() async throws
}
