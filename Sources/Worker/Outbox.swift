import FCM
import Foundation
import Postgres
import Runtime

/// The outbox: every row of `downstream_messages` is claimed under a lease, sent over
/// XMPP (`xmpp`) or FCM's legacy HTTP protocol (`http`), and its fate written back.
///
/// Both transports share one claim store per transport (`FOR UPDATE SKIP LOCKED`, a lease
/// renewed every third of itself while the worker holds the row), one LISTEN, one
/// settlement of answers into row updates (`OutboxSettlement`) and one write-back; each
/// transport is a thin shell that claims and sends.
///
/// As a service it runs until cancelled, then stops claiming, waits up to `answerWait`
/// for the answers to what is pending over XMPP and for the HTTP requests under way (less
/// when the shutdown becomes urgent), hands back every row it still holds (claimable at
/// once by any worker), and writes everything back, within `answerWait` plus 2 s; rows
/// whose state cannot be written by then (the database is down) keep their claim until
/// the lease lapses, and are then sent again.
final class Outbox: Sendable {
    let xmpp: XMPPOutboxSender
    let http: HTTPOutboxSender
    private let writeBack: OutboxWriteBack
    private let stores: [OutboxStore]
    private let listener: OutboxListener
    private let settings: DownstreamSettings
    private let logger: Logger

    init(pool: PostgresPool, client: FCMHTTPClient, settings: DownstreamSettings, logger: Logger, observer: WorkerObserver?) {
        let xmppStore = OutboxStore(pool: pool, workerID: settings.workerID, lease: settings.lease, transport: "xmpp")
        let httpStore = OutboxStore(pool: pool, workerID: settings.workerID, lease: settings.lease, transport: "http")
        let xmppDoorbell = Doorbell(), httpDoorbell = Doorbell()
        // A written retry may be due already: let the claim loops look.
        let writeBack = OutboxWriteBack(store: xmppStore, logger: logger, onCommit: {
            xmppDoorbell.ring()
            httpDoorbell.ring()
        })
        self.writeBack = writeBack
        self.stores = [xmppStore, httpStore]
        self.settings = settings
        self.logger = logger
        self.xmpp = XMPPOutboxSender(store: xmppStore, writeBack: writeBack, doorbell: xmppDoorbell, settings: settings, logger: logger)
        self.http = HTTPOutboxSender(store: httpStore, client: client, writeBack: writeBack, doorbell: httpDoorbell,
                                     settings: settings, logger: logger.labeled("http"))
        self.listener = OutboxListener(target: pool.target, connectTimeout: pool.connectTimeout, doorbells: [xmppDoorbell, httpDoorbell],
                                       logger: logger, onListening: { observer?(.outboxListening) })
    }

    /// The outbox as a service of the worker (see the type's description).
    func service(answerWait: Duration, shutdown: ShutdownSignal) -> some Service {
        Running(outbox: self, answerWait: answerWait, shutdown: shutdown)
    }

    private struct Running: Service {
        let outbox: Outbox
        let answerWait: Duration
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
            await shielded { [outbox, answerWait, shutdown] in
                let deadline = ContinuousClock.now + answerWait
                outbox.http.stopClaiming()
                // HTTP requests under way get the same time as XMPP answers, then are abandoned.
                let httpDeadline = Task {
                    await shutdown.sleepUnlessUrgent(for: deadline - .now)
                    if !Task.isCancelled { sendingOverHTTP.cancel() }
                }
                await outbox.xmpp.finish(until: deadline, shutdown: shutdown)
                await sendingOverHTTP.value
                httpDeadline.cancel()
                renewing.cancel()
                outbox.writeBack.stop()
                let flushWindow = shutdown.isUrgent ? .milliseconds(200) : max(deadline - .now, .zero) + .seconds(2)
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

    /// Renews the lease on every row either transport holds, every third of the lease,
    /// until cancelled.
    private func renewLeases() async {
        let period = settings.lease / 3
        while await sleepUnlessCancelled(for: period) {
            let ids = xmpp.heldRowIDs + http.heldRowIDs
            guard !ids.isEmpty else { continue }
            do {
                try await stores[0].renew(ids)
            } catch {
                guard !Task.isCancelled else { return }
                logger.warning("could not renew the claim on \(ids.count) outbox row(s): \(error)")
            }
        }
    }
}
