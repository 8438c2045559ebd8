import Foundation
import Runtime

/// Where a transport's answers go: each row update and token mark to the write-back
/// (counted for metrics), and each retry's due time to the transport's claim loop, which
/// sweeps when it falls due (and its write has committed). Shared by one transport and its
/// loop.
package final class OutboxRecorder: Sendable {
    package let transport: String
    package let writeBack: OutboxWriteBack
    package let metrics: any OutboxMetrics
    /// Rings the transport's claim loop.
    package let doorbell: Doorbell
    private let dueTimes = BlockingLock(DueTimes())

    package init(transport: String, writeBack: OutboxWriteBack, metrics: any OutboxMetrics, doorbell: Doorbell) {
        self.transport = transport
        self.writeBack = writeBack
        self.metrics = metrics
        self.doorbell = doorbell
    }

    /// Hands row updates and token marks to the write-back, counted for metrics; returns
    /// the write's number (for `retry(dueAt:written:)`).
    @discardableResult
    package func record(_ updates: [OutboxUpdate], tokens: [TokenMark] = []) -> UInt64 {
        metrics.downstream(updates, transport: transport)
        return writeBack.record(updates, tokens: tokens)
    }

    /// What was recorded so far, for the shutdown summary (from the metrics' counts by
    /// outcome, which every update goes through already).
    package var summary: String {
        let counts = metrics.downstreamOutcomes(transport: transport)
        return "acked \((counts["acked"] ?? 0) + (counts["delivered"] ?? 0)), failed \(counts["failed"] ?? 0), "
            + "retried \(counts["retried"] ?? 0), expired \(counts["expired"] ?? 0), put back unsent \(counts["handed_back"] ?? 0)"
    }

    /// A retry recorded by write `written` falls due at `instant`: the loop sweeps then.
    package func retry(dueAt instant: ContinuousClock.Instant, written: UInt64) {
        dueTimes.withLock { $0.insert(instant, written: written) }
    }

    /// Whether a recorded retry is due by `now` (its loop sweeps once its write commits).
    package func hasRetryDue(by now: ContinuousClock.Instant) -> Bool {
        dueTimes.withLock { $0.hasPassed(by: now) }
    }

    /// Forgets the due times that have passed and whose writes committed: whether there
    /// were any, and the next one still kept.
    package func popDue(before now: ContinuousClock.Instant) -> (passed: Bool, next: ContinuousClock.Instant?) {
        let committed = writeBack.committed
        return dueTimes.withLock { $0.popPassed(before: now, written: committed) }
    }
}
