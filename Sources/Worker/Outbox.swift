import FCM
import Foundation
import Postgres
import Runtime

/// The outbox: every row of `downstream_messages` is claimed under a lease, sent over
/// XMPP (`xmpp`) or FCM's legacy HTTP protocol (`http`), and its fate written back.
///
/// Both transports share one claim store per transport (claims per batch, `OutboxStore`, a
/// lease renewed every third of itself while the worker holds a claim), one LISTEN, one
/// settlement of answers into row updates (`OutboxSettlement`) and one write-back; each
/// transport is a thin shell that claims and sends.
///
/// As a service it runs until cancelled, then stops claiming, waits for the answers to
/// what is pending over XMPP and for the HTTP requests under way (up to 5 s after the
/// shutdown was requested, never past the shutdown timeout, not at all once the shutdown
/// is urgent), hands back every row it still holds (claimable at once by any worker), and
/// writes everything back by the shutdown timeout plus a second; rows whose state cannot
/// be written by then (the database is down) keep their claim until the lease lapses,
/// and are then sent again.
final class Outbox: Sendable {
    let xmpp: XMPPOutboxSender
    let http: HTTPOutboxSender
    private let writeBack: OutboxWriteBack
    private let stores: [OutboxStore]
    private let listener: OutboxListener
    private let settings: DownstreamSettings
    private let logger: Logger

    init(pool: PostgresPool, client: FCMHTTPClient, settings: DownstreamSettings, logger: Logger, observer: WorkerObserver?,
         metrics: WorkerMetrics) {
        let ledger = ClaimLedger()
        let xmppStore = OutboxStore(pool: pool, workerID: settings.workerID, lease: settings.lease, transport: "xmpp", ledger: ledger)
        let httpStore = OutboxStore(pool: pool, workerID: settings.workerID, lease: settings.lease, transport: "http", ledger: ledger)
        let xmppDoorbell = Doorbell(), httpDoorbell = Doorbell()
        // A written XMPP retry may be due already: let its claim loop look. (The HTTP sender
        // finds its retries with its sweep: waking it on every write would cost PostgreSQL
        // a claim query per batch of answers.)
        let writeBack = OutboxWriteBack(store: xmppStore, logger: logger, onCommit: { xmppDoorbell.ring() })
        self.writeBack = writeBack
        self.stores = [xmppStore, httpStore]
        self.settings = settings
        self.logger = logger
        self.xmpp = XMPPOutboxSender(store: xmppStore, writeBack: writeBack, doorbell: xmppDoorbell, settings: settings, logger: logger,
                                     metrics: metrics)
        self.http = HTTPOutboxSender(store: httpStore, client: client, writeBack: writeBack, doorbell: httpDoorbell,
                                     settings: settings, logger: logger.labeled("http"), metrics: metrics)
        self.listener = OutboxListener(target: pool.target, connectTimeout: pool.connectTimeout, doorbells: [xmppDoorbell, httpDoorbell],
                                       logger: logger, onListening: { observer?(.outboxListening) })
    }

    /// The outbox as a service of the worker (see the type's description).
    func service(shutdownTimeout: Duration, shutdown: ShutdownSignal) -> some Service {
        Running(outbox: self, shutdownTimeout: shutdownTimeout, shutdown: shutdown)
    }

    /// The longest wait for answers at shutdown.
    static let answerWait: Duration = .seconds(5)

    private struct Running: Service {
        let outbox: Outbox
        let shutdownTimeout: Duration
        let shutdown: ShutdownSignal
        var name: String { "outbox" }

        func run() async {
            // Not child tasks: they go on while the service winds down.
            let writing = Task { await outbox.writeBack.run() }
            let renewing = Task { await outbox.renewLeases() }
            let sendingOverHTTP = Task { await outbox.http.run() }
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await outbox.listener.run() }
                group.addTask { await outbox.xmpp.claimLoop() }
                await waitUntilCancelled()
            }
            await shielded { [outbox, shutdownTimeout, shutdown] in
                let deadline = shutdown.deadline(after: min(shutdownTimeout, Outbox.answerWait))
                outbox.http.stopClaiming()
                // HTTP requests under way get the same time as XMPP answers, then are abandoned.
                let httpDeadline = Task {
                    await shutdown.sleepUnlessUrgent(until: deadline)
                    if !Task.isCancelled { sendingOverHTTP.cancel() }
                }
                await outbox.xmpp.finish(until: deadline, shutdown: shutdown)
                await sendingOverHTTP.value
                httpDeadline.cancel()
                renewing.cancel()
                outbox.writeBack.stop()
                let flushDeadline = shutdown.deadline(after: shutdownTimeout + .seconds(1))
                let flushWindow = shutdown.isUrgent ? .milliseconds(200) : max(flushDeadline - .now, .milliseconds(200))
                if !(await outbox.writeBack.flushed(within: flushWindow)) {
                    outbox.logger.error("could not write the state of outbox rows "
                                        + "\(outbox.writeBack.unwrittenRows.prefix(20).map(String.init).joined(separator: ",")) "
                                        + "before shutdown; their claims lapse after \(outbox.settings.lease.formattedSeconds) and they are sent again")
                    writing.cancel()
                }
                await writing.value
            }
        }
    }

    /// Renews the lease of every claim either transport holds, every third of the lease,
    /// until cancelled.
    private func renewLeases() async {
        let period = settings.lease / 3
        while await sleepUnlessCancelled(for: period) {
            do {
                let lost = try await stores[0].renewClaims()
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
