/// What an `HTTPServer` tells its owner about what it refused on its own, before a request
/// reached the handler: each call comes on the thread where it happened (an accept loop, a
/// connection's loop) and must not block. The ingress counts them in its metrics and logs
/// them throttled.
package struct HTTPServerObserver: Sendable {
    /// A request answered by the HTTP layer itself: its status (400, 408, 413, 431, 501,
    /// 505) and the reason code of its body.
    package var refusedRequest: @Sendable (_ status: Int, _ reason: String) -> Void
    /// A connection closed as it was accepted: `full` (at the connection limit),
    /// `descriptors` (out of descriptors or memory for it), `draining` (shutting down).
    package var refusedConnection: @Sendable (_ reason: String) -> Void
    /// A connection closed by a timer: `handshake` (TLS not done in time), `idle`, `request`
    /// (a request not complete in time).
    package var timedOut: @Sendable (_ what: String) -> Void

    package init(refusedRequest: @escaping @Sendable (_ status: Int, _ reason: String) -> Void = { _, _ in },
                 refusedConnection: @escaping @Sendable (_ reason: String) -> Void = { _ in },
                 timedOut: @escaping @Sendable (_ what: String) -> Void = { _ in }) {
        self.refusedRequest = refusedRequest
        self.refusedConnection = refusedConnection
        self.timedOut = timedOut
    }
}
