/// What the outbox counts, for the worker's metrics (`WorkerMetrics` is one): the outbox
/// depends on this, never on the worker.
package protocol OutboxMetrics: Sendable {
    /// Rows moved to new states by `transport`.
    func downstream(_ updates: [OutboxUpdate], transport: String)
    /// Times from sending a message over XMPP to CCS's answer, in seconds.
    func downstreamRoundTrips(_ seconds: [Double])
    /// v1 sending stopped (true) for a sender mismatch, or resumed (false).
    func v1SendingStopped(_ stopped: Bool)
}

extension OutboxMetrics {
    package func v1SendingStopped(_ stopped: Bool) {}
}
