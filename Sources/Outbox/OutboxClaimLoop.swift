import FCM
import Foundation
import Runtime

/// The outbox's one claim/settle loop, the same for every transport: claims the
/// transport's due rows as it has room, settles the rows that cannot be sent, and hands the
/// others to the transport.
///
/// - Claims (`OutboxStore`) when the transport wants at least its `claimThreshold` rows and
///   the write-back is not far behind, at most 2,000 a claim; woken by its doorbell (a
///   NOTIFY, a write-back commit, the transport making room) and otherwise every sweep
///   interval.
/// - Sweeps for rows due again (retries, rows handed back, the rows of expired claims) every
///   sweep interval, and as soon as a retry the transport recorded falls due and its write
///   has committed.
/// - Settles a row that cannot be sent without sending it: a token FCM refused before, a
///   payload FCM would refuse (when the transport `validatesRows`), a time to live that
///   passed, or `--retry-max-age` passed for a retry.
/// - Waits with backoff while the database is unreachable.
package final class OutboxClaimLoop: Sendable {
    package let transport: any DownstreamTransport
    package let store: OutboxStore
    package let recorder: OutboxRecorder
    package let settings: DownstreamSettings
    private let logger: Logger
    private let state = BlockingLock(State())
    /// Rows that expired unsent are logged once a minute per reason.
    private let refusalWarnings = WarningThrottle()

    private struct State {
        package var claiming = true
        /// A retry fell due: the next claim sweeps.
        package var sweepWanted = true
        package var claimed = 0
        /// It claims nothing until the write-back's backlog shrinks.
        package var heldByWriteBack = false
    }

    /// The most rows one claim takes.
    package static let claimLimit = 2000
    /// Updates waiting for the write-back beyond which no row is claimed.
    package static let writeBackLimit = 50_000

    package init(transport: any DownstreamTransport, store: OutboxStore, recorder: OutboxRecorder, settings: DownstreamSettings, logger: Logger) {
        self.transport = transport
        self.store = store
        self.recorder = recorder
        self.settings = settings
        self.logger = logger
    }

    /// Rows claimed so far.
    package var claimed: Int { state.withLock { $0.claimed } }

    /// Claims and hands rows to the transport until `stopClaiming()`, cancellation, or the
    /// transport's stop.
    package func run() async {
        var outage = Backoff.outage(base: .milliseconds(100), cap: .seconds(10))
        var lastSweep: ContinuousClock.Instant?
        while state.withLock({ $0.claiming }) && !transport.isStopped && !Task.isCancelled {
            transport.tick()
            let wanted = transport.wantedRows()
            let heldByWriteBack = recorder.writeBack.backlog >= Self.writeBackLimit
            state.withLock { $0.heldByWriteBack = heldByWriteBack }
            guard wanted >= transport.claimThreshold, !heldByWriteBack else {
                await recorder.doorbell.wait(timeout: sweepWait())
                continue
            }
            let limit = min(wanted, Self.claimLimit)
            let rows: [OutboxStore.ClaimedRow]
            do {
                let now = ContinuousClock.now
                let sweeping = state.withLock { state in
                    defer { state.sweepWanted = false }
                    return state.sweepWanted || lastSweep.map { now - $0 >= settings.sweepInterval } ?? true
                }
                do {
                    rows = try await store.claim(limit: limit, sweeping: sweeping)
                } catch {
                    if sweeping { state.withLock { $0.sweepWanted = true } }
                    throw error
                }
                if sweeping { lastSweep = now }
                outage.reset()
            } catch {
                guard !Task.isCancelled else { return }
                let delay = outage.next()
                logger.warning("could not claim outbox rows for \(transport.name) (retrying in \(delay.formattedSeconds)): \(error)")
                await recorder.doorbell.wait(timeout: delay)
                continue
            }
            state.withLock { $0.claimed += rows.count }
            let ready = settle(rows)
            if !ready.isEmpty { await transport.send(ready) }
            if rows.count < limit { await recorder.doorbell.wait(timeout: sweepWait()) }
        }
    }

    /// The write-back committed a batch: wakes the loop when it waits for that (a retry due
    /// whose write was pending, or claims held back by the write-back's backlog), and only
    /// then. Waking it on every commit would cost PostgreSQL an empty claim per batch of
    /// another transport's answers: at 1 connection × 20 ms, an idle XMPP transport beside a
    /// busy v1 one made two or three for each v1 claim.
    package func writeBackCommitted() {
        if state.withLock({ $0.heldByWriteBack }) || recorder.hasRetryDue(by: .now) { recorder.doorbell.ring() }
    }

    /// Stops claiming; `run()` returns at its next turn.
    package func stopClaiming() {
        state.withLock { $0.claiming = false }
        recorder.doorbell.ring()
    }

    /// The rows as messages for the transport; those that cannot be sent are settled (and
    /// recorded) here.
    private func settle(_ rows: [OutboxStore.ClaimedRow]) -> [ClaimedMessage] {
        var ready: [ClaimedMessage] = []
        ready.reserveCapacity(rows.count)
        var refused: [OutboxUpdate] = []
        let now = Date()
        for row in rows {
            switch transport.prepare(row, maximumAge: settings.retry.maximumAge, now: now) {
            case .success(let claimed):
                ready.append(claimed)
            case .failure(let refusal):
                refusal.log(rowID: row.id, to: logger, throttle: refusalWarnings)
                refused.append(OutboxUpdate(rowID: row.id, status: refusal.status, errorCode: refusal.errorCode,
                                            errorDescription: refusal.description))
            }
        }
        if !refused.isEmpty { recorder.record(refused) }
        return ready
    }

    /// Until the next sweep, or until the next recorded retry falls due if sooner.
    private func sweepWait() -> Duration {
        // A few milliseconds late, so that the row's write-back has landed.
        let now = ContinuousClock.now
        let (passed, next) = recorder.popDue(before: now)
        if passed {
            state.withLock { $0.sweepWanted = true }
            return .zero
        }
        guard let next else { return settings.sweepInterval }
        // A retry due but not yet written: the write's commit rings the doorbell (of the
        // transports that ask for it), or the next turn looks again.
        return min(settings.sweepInterval, max(.milliseconds(20), next - now))
    }
}
