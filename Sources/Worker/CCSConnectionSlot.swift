import FCM
import Foundation
import Synchronization
import XMPP
import Runtime
import Transport

/// Keeps one CCS connection alive: connects, serves it until it ends, and reconnects with
/// exponential backoff and full jitter. Every upstream message goes to the pipeline; its
/// ack is sent at once (immediate mode) or after the commit (durable mode). Downstream
/// answers, receipts and draining go to the outbox sender, which sends on the connection.
///
/// When CCS drains a connection, a replacement connects at once while the old one is
/// still read (its upstream messages acked on it, its pending downstream answered) until
/// CCS closes it. Stops for configuration errors (credentials or certificate refused),
/// which retrying cannot fix, and on shutdown, when it stops reading and hands back the
/// open connections so that their acks can be flushed after the pipeline drains.
final class CCSConnectionSlot: Sendable {
    let index: Int
    let configuration: WorkerConfiguration
    let tls: TLSContext
    let logger: Logger
    let observer: WorkerObserver?
    let pipeline: UpstreamPipeline
    let sender: OutboxSender
    let shutdown: ShutdownSignal
    private let open = Mutex(OpenConnections())

    /// The connection being served and those CCS is draining.
    private struct OpenConnections {
        var serving: XMPPConnection?
        var draining: [ObjectIdentifier: XMPPConnection] = [:]
        var drainingReaders: [Task<Void, Never>] = []
        var all: [XMPPConnection] { (serving.map { [$0] } ?? []) + draining.values }
    }

    init(index: Int, configuration: WorkerConfiguration, tls: TLSContext, logger: Logger, observer: WorkerObserver?,
         pipeline: UpstreamPipeline, sender: OutboxSender, shutdown: ShutdownSignal) {
        self.index = index
        self.configuration = configuration
        self.tls = tls
        self.logger = logger
        self.observer = observer
        self.pipeline = pipeline
        self.sender = sender
        self.shutdown = shutdown
    }

    private var label: String { "ccs#\(index)" }

    /// Runs until shutdown; returns the connections still open then (the one served and
    /// any CCS is still draining).
    func run() async throws -> [XMPPConnection] {
        var backoff = Backoff.reconnect(base: configuration.reconnectBase, cap: configuration.reconnectCap)
        let slot = self
        shutdown.onRequest {
            for connection in slot.open.withLock({ $0.all }) { connection.stopReceiving() }
        }
        var generation = 0
        while !shutdown.isRequested {
            let started = ContinuousClock.now
            do {
                var client = configuration.xmppClient
                let drainHook = DrainHook(sender: sender)
                client.interceptor = CCSAckInterceptor(ackMode: configuration.ackMode, onDraining: { drainHook.fire() })
                generation += 1
                let connection = try await XMPPConnection.connect(client, tls: tls, label: "\(label).\(generation)")
                open.withLock { $0.serving = connection }
                if shutdown.isRequested { connection.stopReceiving() }
                logger.info("connected to \(configuration.host):\(configuration.port) as \(connection.label), bound as \(connection.boundJID)")
                observer?(.connected(slot: index, jid: connection.boundJID))
                if ThreadPriority.takeUnreportedRefusal() {
                    logger.warning("connection threads could not raise their priority (nice \(configuration.ioNiceness.map(String.init) ?? "-")): "
                                     + "that needs root or CAP_SYS_NICE; acks may wait behind database work on busy cores "
                                     + "(pass --io-niceness off to silence this)")
                }
                let link = sender.attach(connection)
                drainHook.link = link
                if await serve(connection, link: link) {
                    keepReadingWhileDraining(connection, link: link)
                    observer?(.reconnectScheduled(slot: index, delay: .zero))
                    continue
                }
                sender.detach(link)
                if shutdown.isRequested { break }
                open.withLock { $0.serving = nil }
                let reason = await connection.closed()
                if ContinuousClock.now - started >= .seconds(60) { backoff.reset() }
                logger.warning("connection \(connection.label) ended: \(reason)")
                observer?(.disconnected(slot: index, reason: reason))
            } catch let error as XMPPError where error.isConfigurationError {
                logger.error("\(error)")
                await waitForDrainingReaders()
                throw error
            } catch let error as XMPPError {
                if shutdown.isRequested { break }
                logger.warning("connecting failed: \(error)")
                observer?(.disconnected(slot: index, reason: error))
            } catch {
                if shutdown.isRequested { break }
                logger.warning("connecting failed: \(error)")
            }
            let delay = backoff.next()
            logger.info("reconnecting in \(delay.formattedSeconds) (attempt \(backoff.attempt))")
            observer?(.reconnectScheduled(slot: index, delay: delay))
            await shutdown.sleep(for: delay)
        }
        await waitForDrainingReaders()
        return open.withLock { $0.all }
    }

    /// Reads stanzas until the stream ends or receiving stops (false), or until CCS
    /// announces that it is draining the connection (true).
    private func serve(_ connection: XMPPConnection, link: Int) async -> Bool {
        let route = ackRoute(for: connection)
        while let batch = await connection.nextReceived(maximum: Self.readBatch) {
            if await handle(batch, on: connection, route: route, link: link) { return true }
        }
        return false
    }

    /// Stanzas taken from a connection at once: what one read turn typically completes.
    private static let readBatch = 256

    /// Handles stanzas in order and hands their upstream work to the pipeline together.
    /// Returns true when the batch held a `CONNECTION_DRAINING` control message; the
    /// stanzas after it are handled too (upstream messages behind it were acked already).
    private func handle(_ batch: [ReceivedStanza], on connection: XMPPConnection, route: AckRoute, link: Int) async -> Bool {
        var work: [UpstreamWork] = []
        work.reserveCapacity(batch.count)
        var draining = false
        for received in batch where handle(received, on: connection, route: route, link: link, into: &work) { draining = true }
        if !work.isEmpty { await pipeline.submit(work) }
        return draining
    }

    /// Reads a draining connection in the background until CCS closes it (its upstream
    /// messages are acked on it, its pending downstream messages answered), then hands
    /// what is still pending on it to the other connections.
    private func keepReadingWhileDraining(_ connection: XMPPConnection, link: Int) {
        logger.info("CCS is draining \(connection.label): opening a replacement now, reading it until CCS closes it")
        let key = ObjectIdentifier(connection)
        let route = ackRoute(for: connection)
        let reader = Task { [self] in
            while let batch = await connection.nextReceived(maximum: Self.readBatch) {
                _ = await handle(batch, on: connection, route: route, link: link)
            }
            sender.detach(link)
            if shutdown.isRequested { return }
            let reason = await connection.closed()
            open.withLock { _ = $0.draining.removeValue(forKey: key) }
            logger.info("drained connection \(connection.label) ended: \(reason)")
            observer?(.disconnected(slot: index, reason: reason))
        }
        open.withLock { state in
            state.serving = nil
            state.draining[key] = connection
            state.drainingReaders.append(reader)
        }
        if shutdown.isRequested { connection.stopReceiving() }
    }

    /// Waits for the readers of draining connections (they end once receiving stops).
    private func waitForDrainingReaders() async {
        for reader in open.withLock({ $0.drainingReaders }) { await reader.value }
    }

    /// Returns true when CCS announced it is draining this connection. The connection's
    /// thread already decoded the stanza and, where the mode says so, acked it.
    private func handle(_ received: ReceivedStanza, on connection: XMPPConnection, route: AckRoute, link: Int,
                        into work: inout [UpstreamWork]) -> Bool {
        let stanza = received.element
        if stanza.name == "message", stanza.attribute("type") == "error" {
            let condition = stanza.child("error")?.elements.first { $0.name != "text" }?.name ?? "undefined-condition"
            let text = stanza.child("error")?.child("text")?.text
            logger.warning("stanza error for id \(stanza.attribute("id") ?? "?"): \(condition) \(text ?? "")")
            if let stanzaID = stanza.attribute("id") {
                sender.received(.stanzaError(stanzaID: stanzaID, condition: condition, text: text), on: link)
            }
            return false
        }
        guard let intercepted = received.attachment as? InterceptedCCS, let payload = intercepted.payload,
              let decoded = intercepted.decoded else {
            logger.debug("ignored stanza <\(stanza.name)>")
            return false
        }
        let receivedAt = intercepted.receivedAt
        let message: CCSMessage
        switch decoded {
        case .success(let value):
            message = value
        case .failure(let error):
            logger.warning("unreadable CCS message, dead-lettered: \(error)")
            observer?(.unreadable(slot: index, reason: error.description))
            work.append(UpstreamWork(kind: .deadLetter(.init(
                rawPayload: payload, reason: "unreadable", error: error.description, attempts: 0, receivedAt: receivedAt))))
            return false
        }
        switch message {
        case .upstream(let upstream):
            guard let messageID = upstream.messageID, let from = upstream.from else {
                logger.warning("cannot ack a message without message_id or from; dead-lettered: \(payload.prefix(200))")
                observer?(.unackable(slot: index, raw: payload))
                work.append(UpstreamWork(kind: .deadLetter(.init(
                    messageID: upstream.messageID, from: upstream.from, category: upstream.category, rawPayload: payload,
                    reason: "unackable", error: "missing \(upstream.messageID == nil ? "message_id" : "from")",
                    attempts: 0, receivedAt: receivedAt))))
                return false
            }
            var item = UpstreamWork(kind: .message(UpstreamMessage(
                upstream, messageID: messageID, from: from, connection: connection.label, receivedAt: receivedAt)))
            if intercepted.acked {
                observer?(.acked(slot: index, messageID: messageID, message: message))
            } else {
                item.ack = route.pending(messageID: messageID, from: from, message: message)
            }
            work.append(item)
        case .receipt(let receipt):
            if intercepted.acked, let messageID = receipt.messageID {
                observer?(.acked(slot: index, messageID: messageID, message: message))
            } else {
                logger.warning("a receipt without message_id or from: \(payload.prefix(200))")
            }
            if let original = receipt.data["original_message_id"]?.stringValue {
                sender.receipt(originalMessageID: original, at: receivedAt)
            }
        case .ack(let messageID, _, let canonical):
            sender.received(.ack(messageID: messageID, canonicalToken: canonical), on: link)
        case .nack(let messageID, _, let error, let description, _):
            logger.info("CCS nacked \(messageID): \(error) \(description ?? "")")
            sender.received(.nack(messageID: messageID, code: error, description: description), on: link)
        case .control(let type):
            if type == "CONNECTION_DRAINING" {
                sender.drain(link)
                return true
            }
            logger.info("control message \(type)")
        }
        return false
    }

    /// Where durable-mode acks of `connection` go after their commit.
    private func ackRoute(for connection: XMPPConnection) -> AckRoute {
        AckRoute(connection: connection, onSent: { [index, observer] messageID, message in
            observer?(.acked(slot: index, messageID: messageID, message: message))
        }, onFailure: { [logger] messageIDs, error in
            logger.warning("could not ack \(messageIDs.count) message(s) (\(messageIDs.prefix(3).joined(separator: ","))…): \(error); CCS will redeliver them")
        })
    }
}

/// Tells the sender, from the connection's thread, that CCS drains the connection: no
/// send is placed on it once the control message is parsed. (Before the connection has a
/// link, the reader's own handling of the control message does it.)
private final class DrainHook: Sendable {
    private let sender: OutboxSender
    private let linked = Mutex<Int?>(nil)

    init(sender: OutboxSender) { self.sender = sender }

    var link: Int? {
        get { linked.withLock { $0 } }
        set { linked.withLock { $0 = newValue } }
    }

    func fire() {
        if let link { sender.drain(link) }
    }
}

/// What the worker did, for tests and embedding applications.
public enum WorkerEvent: Sendable {
    case connected(slot: Int, jid: String)
    case disconnected(slot: Int, reason: XMPPError)
    case reconnectScheduled(slot: Int, delay: Duration)
    case acked(slot: Int, messageID: String, message: CCSMessage)
    case unackable(slot: Int, raw: String)
    case unreadable(slot: Int, reason: String)
    /// A batch committed: the messages handled (id, arrival), duplicates skipped, dead letters written.
    case committed(handled: [(String, Date)], duplicates: Int, deadLettered: [String])
    case retryScheduled(messageID: String, attempt: Int, delay: Duration)
    case databaseUnavailable(String)
    case spooled(count: Int, path: String)
    /// The outbox sender listens for NOTIFY: rows inserted from now on wake it at once.
    case outboxListening
    case replayed(count: Int)
}

/// Receives `WorkerEvent`s as they happen, from any task.
public typealias WorkerObserver = @Sendable (WorkerEvent) -> Void
