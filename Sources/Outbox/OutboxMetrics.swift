/// What the outbox counts, for the worker's metrics (`WorkerMetrics` is one): the outbox
/// depends on this, never on the worker.
package protocol OutboxMetrics: Sendable {
    /// Rows moved to new states by `transport`.
    func downstream(_ updates: [OutboxUpdate], transport: String)
    /// Times from sending a message over XMPP to CCS's answer, in seconds.
    func downstreamRoundTrips(_ seconds: [Double])
    /// v1 sending stopped (true) for a sender mismatch, or resumed (false).
    func v1SendingStopped(_ stopped: Bool)
    /// Rows no claim would have seen were found and queued for sending.
    func strandedRowsRescued(_ count: Int, transport: String)
    /// The rows of `transport` moved to each outcome so far (`acked`, `failed`, `retried`,
    /// `expired`, `handed_back`, …), as `downstream` counted them.
    func downstreamOutcomes(transport: String) -> [String: Int]
}

extension OutboxMetrics {
    package func v1SendingStopped(_ stopped: Bool) {}
    package func strandedRowsRescued(_ count: Int, transport: String) {}
    package func downstreamOutcomes(transport: String) -> [String: Int] { [:] }
}
