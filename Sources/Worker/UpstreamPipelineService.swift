import Foundation
import Runtime

/// The upstream pipeline as a service of the worker: it commits until cancelled, then
/// lets what is queued commit until `shutdownTimeout` after the shutdown was requested
/// (at once when the shutdown becomes urgent), abandons the rest (a transaction under way included) and writes what was
/// acked but not committed to the spool, which the next start replays. Work whose ack
/// waits for its commit (durable mode) is not spooled: CCS redelivers it.
struct UpstreamPipelineService: Service {
    let pipeline: UpstreamPipeline
    let spool: Spool
    let shutdownTimeout: Duration
    let shutdown: ShutdownSignal
    let logger: Logger
    let observer: WorkerObserver?
    let metrics: WorkerMetrics
    /// Where acked messages that could not be spooled are reported.
    let losses: ShutdownLosses

    var name: String { "pipeline" }

    func run() async {
        // Not a child task: it goes on committing after this service is cancelled.
        let lanes = Task { await pipeline.run() }
        await waitUntilCancelled()
        logger.info("shutting down: \(pipeline.backlog) message(s) still queued")
        pipeline.close()
        let deadline = Task { [shutdown, shutdownTimeout] in
            await shutdown.sleepUnlessUrgent(until: shutdown.deadline(after: shutdownTimeout))
            if !Task.isCancelled { lanes.cancel() }
        }
        let leftovers = await lanes.value
        deadline.cancel()
        guard !leftovers.isEmpty else { return }
        let acked = leftovers.filter(\.isAcked)
        let journaled = leftovers.count { $0.journalSegment != nil }
        logger.warning("\(leftovers.count) message(s) could not be committed before the shutdown deadline; "
                       + "\(acked.count) acked one(s) go to the spool \(spool.path)"
                       + (journaled > 0 ? ", \(journaled) journaled one(s) stay in the journal for the next start" : ""))
        guard !acked.isEmpty else { return }
        do {
            try spool.append(acked.map(\.spoolEntry))
            metrics.spooled(acked.count)
            observer?(.spooled(count: acked.count, path: spool.path))
        } catch {
            logger.error("COULD NOT WRITE THE SPOOL \(spool.path): \(error); \(acked.count) acked message(s) are lost: "
                         + acked.compactMap(\.messageID).joined(separator: ","))
            metrics.lost(acked.count)
            losses.record(acked.count, reason: "could not write the spool \(spool.path): \(error)")
        }
    }
}
