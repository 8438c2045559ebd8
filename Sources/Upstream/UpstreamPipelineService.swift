import Foundation
import Runtime

/// The upstream pipeline as a service of the worker: it commits until its stage stops, then
/// lets what is queued commit until `shutdownTimeout` after the shutdown was requested
/// (at once when the shutdown becomes urgent), abandons the rest (a transaction under way included) and writes what was
/// acked but not committed to the spool, which the next start replays. Work whose ack
/// waits for its commit (durable mode) is not spooled: CCS redelivers it.
///
/// Cancelled, its lanes give up at once, and the reading may still hand on what its
/// connections received (acked already) after that. So the spool is written only once
/// `stop` is requested, which the `ServiceGroup` does after the earlier stages (the reading)
/// have returned, cancelled or not; what they handed on late is spooled with the rest.
package struct UpstreamPipelineService: Service {
    let pipeline: UpstreamPipeline
    let spool: Spool
    let shutdownTimeout: Duration
    let shutdown: ShutdownSignal
    let logger: Logger
    let observer: WorkerObserver?
    let metrics: any UpstreamMetrics
    /// Where acked messages that could not be spooled are reported.
    let losses: ShutdownLosses

    package init(pipeline: UpstreamPipeline, spool: Spool, shutdownTimeout: Duration, shutdown: ShutdownSignal, logger: Logger,
                 observer: WorkerObserver?, metrics: any UpstreamMetrics, losses: ShutdownLosses) {
        self.pipeline = pipeline
        self.spool = spool
        self.shutdownTimeout = shutdownTimeout
        self.shutdown = shutdown
        self.logger = logger
        self.observer = observer
        self.metrics = metrics
        self.losses = losses
    }

    package var name: String { "pipeline" }

    package func run(until stop: ShutdownSignal) async {
        // The lanes are stopped at once (cancelled) when the shutdown's deadline passes.
        let stopLanes = ShutdownSignal()
        let lanesLeft = await withTaskGroup(of: [UpstreamWork]?.self) { group in
            group.addTask { [pipeline] in await cancellingOnRequest(stopLanes) { await pipeline.run() } }
            group.addTask { [shutdown, shutdownTimeout, logger, pipeline] in
                await stop.wait()
                logger.info("shutting down: \(pipeline.backlog) message(s) still queued")
                pipeline.close()
                await shutdown.sleepUnlessUrgent(until: shutdown.deadline(after: shutdownTimeout))
                if !Task.isCancelled { stopLanes.request() }
                return nil
            }
            // The lanes' end (what they could not commit) ends the deadline's wait too.
            var leftovers: [UpstreamWork] = []
            while let next = await group.next() {
                if let next {
                    leftovers = next
                    group.cancelAll()
                }
            }
            return leftovers
        }
        // Also when cancelled: the producers' end is what is waited for (at once when stopped).
        await stop.waitIgnoringCancellation()
        let leftovers = lanesLeft + pipeline.takeLate()
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
