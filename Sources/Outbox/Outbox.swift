import FCM
import Foundation
import Postgres
import Runtime

/// The outbox: every row of `downstream_messages` is claimed under a lease, sent by the
/// transport its `transport` column names, and its fate written back.
///
/// The transports (XMPP `xmpp`, FCM's legacy HTTP `http`, FCM's HTTP v1 `v1`) are `DownstreamTransport`s, each
/// driven by one `OutboxClaimLoop` of its own; they share one claim ledger (claims per
/// batch, `OutboxStore`, a lease renewed every third of itself while the worker holds a
/// claim), one LISTEN, one settlement of answers into row updates (`OutboxSettlement`) and
/// one write-back.
///
/// As a service it runs until cancelled, then stops claiming, waits for the answers to
/// what each transport has under way (up to 5 s after the shutdown was requested, never
/// past the shutdown timeout, not at all once the shutdown is urgent), hands back every row
/// it still holds (claimable at once by any worker), and writes everything back by the
/// shutdown timeout plus a second; rows whose state cannot be written by then (the database
/// is down) keep their claim until the lease lapses, and are then sent again.
package final class Outbox: Sendable {
    /// The XMPP transport: the worker's CCS connections attach to it.
    package let xmpp: XMPPTransport
    /// One claim loop per transport, XMPP's first.
    package let loops: [OutboxClaimLoop]

    /// Whether v1 sending goes on now (true without a v1 transport: nothing is held).
    package var v1CanSend: Bool {
        (loops.first { $0.transport.name == "v1" }?.transport as? V1Transport)?.canSend ?? true
    }
    private let writeBack: OutboxWriteBack
    private let ledgerStore: OutboxStore
    /// Nil when new rows are found by the sweep alone (no session connection for LISTEN).
    private let listener: OutboxListener?
    private let settings: DownstreamSettings
    private let logger: Logger
    private let metrics: any OutboxMetrics

    /// - Parameter listenTarget: where the LISTEN for new rows connects: a session of its
    ///   own, which a transaction pooler cannot carry (its notifications go to whichever
    ///   client holds the server connection then). Nil: no LISTEN, new rows are found by the
    ///   sweep (`settings.sweepInterval`).
    /// - Parameter onListening: called each time the LISTEN for new rows is (re)established.
    /// - Parameter client: FCM's legacy HTTP client; without one (no server key), rows with
    ///   transport `http` wait for a worker that has one.
    /// - Parameter v1: FCM's HTTP v1 client; without one, rows with transport `v1` wait for a
    ///   worker that has one.
    /// - Parameter reloads: raised on SIGHUP; v1 sending stopped for a sender mismatch resumes.
    package init(pool: PostgresPool, listenTarget: PostgresConnectionString?, client: FCMHTTPClient?, v1: FCMV1Client? = nil,
                 reloads: ReloadGeneration = ReloadGeneration(),
                 settings: DownstreamSettings, logger: Logger, metrics: any OutboxMetrics, onListening: @escaping @Sendable () -> Void) {
        let ledger = ClaimLedger()
        func store(_ transport: String) -> OutboxStore {
            OutboxStore(pool: pool, workerID: settings.workerID, lease: settings.lease, transport: transport, ledger: ledger)
        }
        let xmppStore = store("xmpp"), httpStore = store("http")
        let xmppDoorbell = Doorbell(), httpDoorbell = Doorbell()
        // Each commit goes to the claim loops (set below), which wake if it is news for them.
        let committedTo = BlockingLock<[OutboxClaimLoop]>([])
        let writeBack = OutboxWriteBack(store: xmppStore, logger: logger, onCommit: {
            for loop in committedTo.withLock({ $0 }) { loop.writeBackCommitted() }
        })
        self.writeBack = writeBack
        self.ledgerStore = xmppStore
        self.settings = settings
        self.logger = logger
        self.metrics = metrics
        let xmppRecorder = OutboxRecorder(transport: "xmpp", writeBack: writeBack, metrics: metrics, doorbell: xmppDoorbell)
        let httpRecorder = OutboxRecorder(transport: "http", writeBack: writeBack, metrics: metrics, doorbell: httpDoorbell)
        let xmpp = XMPPTransport(recorder: xmppRecorder, settings: settings, logger: logger, metrics: metrics)
        self.xmpp = xmpp
        var loops = [OutboxClaimLoop(transport: xmpp, store: xmppStore, recorder: xmppRecorder, settings: settings, logger: logger)]
        if let client {
            let http = LegacyHTTPTransport(client: client, recorder: httpRecorder, settings: settings, logger: logger.labeled("http"))
            loops.append(OutboxClaimLoop(transport: http, store: httpStore, recorder: httpRecorder, settings: settings, logger: logger.labeled("http")))
        }
        if let v1 {
            let v1Recorder = OutboxRecorder(transport: "v1", writeBack: writeBack, metrics: metrics, doorbell: Doorbell())
            let transport = V1Transport(client: v1, recorder: v1Recorder, settings: settings, logger: logger.labeled("v1"),
                                        metrics: metrics, reloads: reloads)
            loops.append(OutboxClaimLoop(transport: transport, store: store("v1"), recorder: v1Recorder, settings: settings,
                                         logger: logger.labeled("v1")))
        }
        self.loops = loops
        committedTo.withLock { $0 = loops }
        let doorbells = loops.map(\.recorder.doorbell)
        self.listener = listenTarget.map {
            OutboxListener(target: $0, connectTimeout: pool.connectTimeout, doorbells: doorbells, logger: logger, onListening: onListening)
        }
    }

    /// The outbox as a service of the worker (see the type's description).
    package func service(shutdownTimeout: Duration, shutdown: ShutdownSignal) -> some Service {
        Running(outbox: self, shutdownTimeout: shutdownTimeout, shutdown: shutdown)
    }

    /// The longest wait for answers at shutdown.
    package static let answerWait: Duration = .seconds(5)

    private struct Running: Service {
        package let outbox: Outbox
        package let shutdownTimeout: Duration
        package let shutdown: ShutdownSignal
        package var name: String { "outbox" }

        package func run(until stop: ShutdownSignal) async {
            // Every part is a child task; each has a signal of its own that stops it at once
            // (it is cancelled), raised in the order the wind-down below needs.
            let stopRenewing = ShutdownSignal(), stopWriting = ShutdownSignal()
            let stopClaiming = outbox.loops.map { _ in ShutdownSignal() }, stopTransports = outbox.loops.map { _ in ShutdownSignal() }
            let claimLoopsEnded = outbox.loops.map { _ in OneShot<Void>() }
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await cancellingOnRequest(stopWriting) { await outbox.writeBack.run() } }
                group.addTask { await cancellingOnRequest(stopRenewing) { await outbox.renewLeases() } }
                group.addTask { await cancellingOnRequest(stopRenewing) { await outbox.rescueStrandedRows() } }
                for (index, loop) in outbox.loops.enumerated() {
                    group.addTask {
                        await cancellingOnRequest(stopClaiming[index]) { await loop.run() }
                        claimLoopsEnded[index].complete(.success(()))
                    }
                    group.addTask { await cancellingOnRequest(stopTransports[index]) { await loop.transport.run() } }
                }
                if let listener = outbox.listener {
                    group.addTask { await cancellingOnRequest(stop) { await listener.run() } }
                }
                await stop.wait()
                await windDown(stopClaiming: stopClaiming, claimLoopsEnded: claimLoopsEnded, stopTransports: stopTransports,
                               stopRenewing: stopRenewing, stopWriting: stopWriting)
                // Cancelled (stop now): every part is cancelled with this task.
                await group.waitForAll()
            }
        }

        /// Stops claiming; each transport's answers, and what its loop has under way, get
        /// until the deadline, then what is still under way is abandoned (handed back); then
        /// the write-back writes everything and ends.
        private func windDown(stopClaiming: [ShutdownSignal], claimLoopsEnded: [OneShot<Void>], stopTransports: [ShutdownSignal],
                              stopRenewing: ShutdownSignal, stopWriting: ShutdownSignal) async {
            let deadline = shutdown.deadline(after: min(shutdownTimeout, Outbox.answerWait))
            for loop in outbox.loops { loop.stopClaiming() }
            await withTaskGroup(of: Void.self) { group in
                for (index, loop) in outbox.loops.enumerated() {
                    group.addTask { [shutdown] in
                        await withTaskGroup(of: Void.self) { timer in
                            // The claim loop is stopped at the deadline if it has not ended by then.
                            timer.addTask {
                                await shutdown.sleepUnlessUrgent(until: deadline)
                                if !Task.isCancelled { stopClaiming[index].request() }
                            }
                            await loop.transport.finish(until: deadline, shutdown: shutdown)
                            _ = try? await claimLoopsEnded[index].value()
                            timer.cancelAll()
                        }
                        // What its senders still hold is handed back.
                        stopTransports[index].request()
                    }
                }
            }
            // XMPP's transport says its own (with what CCS nacked and what was resent).
            for loop in outbox.loops where loop.transport.name != "xmpp" {
                outbox.logger.info("outbox over \(loop.transport.name): \(loop.recorder.summary)")
            }
            stopRenewing.request()
            outbox.writeBack.stop()
            let flushDeadline = shutdown.deadline(after: shutdownTimeout + .seconds(1))
            let flushWindow = shutdown.isUrgent ? .milliseconds(200) : max(flushDeadline - .now, .milliseconds(200))
            if !(await outbox.writeBack.flushed(within: flushWindow)) {
                outbox.logger.error("could not write the state of outbox rows "
                                    + "\(outbox.writeBack.unwrittenRows.prefix(20).map(String.init).joined(separator: ",")) "
                                    + "before shutdown; their claims lapse after \(outbox.settings.lease.formattedSeconds) and they are sent again")
                stopWriting.request()
            }
        }
    }

    /// Every `strandedRowSweep`, finds the rows no claim would see (see
    /// `OutboxStore.rescueStrandedRows`), queues them for sending, counts them and says so,
    /// until cancelled.
    private func rescueStrandedRows() async {
        while await sleepUnlessCancelled(for: settings.strandedRowSweep) {
            do {
                let found = try await ledgerStore.pool.withConnection { connection in
                    try await OutboxStore.rescueStrandedRows(on: connection, olderThan: settings.strandedRowAge)
                }
                guard !found.isEmpty else { continue }
                for (transport, rows) in Dictionary(grouping: found, by: \.transport) {
                    metrics.strandedRowsRescued(rows.count, transport: transport)
                }
                logger.warning("found \(found.count) outbox row(s) no claim would have seen (ids \(found.prefix(10).map { String($0.id) }.joined(separator: ", "))"
                               + "\(found.count > 10 ? ", …" : "")): pending below the claim frontier, their ids taken before their "
                               + "transactions wrote (an explicit nextval() or a reused id); queued for sending now. Let the id column's "
                               + "default give ids (docs/outbox.md)")
                for loop in loops { loop.recorder.doorbell.ring() }
            } catch {
                guard !Task.isCancelled else { return }
                logger.warning("could not look for outbox rows below the claim frontier: \(error)")
            }
        }
    }

    /// Renews the lease of every claim any transport holds, every third of the lease,
    /// until cancelled.
    private func renewLeases() async {
        let period = settings.lease / 3
        while await sleepUnlessCancelled(for: period) {
            do {
                let lost = try await ledgerStore.renewClaims()
                if lost > 0 {
                    logger.warning("the claims on \(lost) outbox row(s) expired and were taken over by another worker; "
                                   + "what this worker learns of them is not written")
                }
            } catch {
                guard !Task.isCancelled else { return }
                logger.warning("could not renew this worker's claims on outbox rows: \(error)")
            }
        }
    }
}
