import FCM
import Foundation
import Synchronization
import XMPP

/// Keeps one CCS connection alive: connects, serves it until it ends, and reconnects with
/// exponential backoff and full jitter. Every upstream message goes to the pipeline; its
/// ack is sent at once (immediate mode) or after the commit (durable mode).
///
/// Stops for configuration errors (credentials or certificate refused), which retrying
/// cannot fix, and on shutdown, when it stops reading and hands back the open connection
/// so that its acks can be flushed after the pipeline drains.
final class CCSConnectionSlot: Sendable {
    let index: Int
    let configuration: WorkerConfiguration
    let tls: TLSContext
    let logger: Logger
    let observer: WorkerObserver?
    let pipeline: UpstreamPipeline
    let shutdown: ShutdownSignal
    private let current = Mutex<XMPPConnection?>(nil)

    init(index: Int, configuration: WorkerConfiguration, tls: TLSContext, logger: Logger, observer: WorkerObserver?,
         pipeline: UpstreamPipeline, shutdown: ShutdownSignal) {
        self.index = index
        self.configuration = configuration
        self.tls = tls
        self.logger = logger
        self.observer = observer
        self.pipeline = pipeline
        self.shutdown = shutdown
    }

    private var label: String { "ccs#\(index)" }

    /// Runs until shutdown; returns the connection still open then (nil if none).
    func run() async throws -> XMPPConnection? {
        var backoff = ReconnectBackoff(base: configuration.reconnectBase, cap: configuration.reconnectCap)
        let slot = self
        shutdown.onRequest { slot.current.withLock { $0 }?.stopReceiving() }
        while !shutdown.isRequested {
            let started = ContinuousClock.now
            var reconnectAtOnce = false
            do {
                var client = configuration.xmppClient
                client.interceptor = CCSAckInterceptor(ackMode: configuration.ackMode)
                let connection = try await XMPPConnection.connect(client, tls: tls, label: label)
                current.withLock { $0 = connection }
                if shutdown.isRequested { connection.stopReceiving() }
                logger.info("connected to \(configuration.host):\(configuration.port), bound as \(connection.boundJID)")
                observer?(.connected(slot: index, jid: connection.boundJID))
                let drained = await serve(connection)
                if shutdown.isRequested { return connection }
                current.withLock { $0 = nil }
                let reason = await connection.closed()
                backoff.sessionEnded(after: .now - started)
                reconnectAtOnce = drained
                logger.warning("connection ended: \(reason)")
                observer?(.disconnected(slot: index, reason: reason))
            } catch let error as XMPPError where error.isConfigurationError {
                logger.error("\(error)")
                throw error
            } catch let error as XMPPError {
                if shutdown.isRequested { return nil }
                logger.warning("connecting failed: \(error)")
                observer?(.disconnected(slot: index, reason: error))
            } catch {
                if shutdown.isRequested { return nil }
                logger.warning("connecting failed: \(error)")
            }
            let delay = reconnectAtOnce ? .zero : backoff.nextDelay()
            logger.info(reconnectAtOnce ? "reconnecting now (the old connection was drained)"
                                        : "reconnecting in \(delay.formattedSeconds) (attempt \(backoff.attempt))")
            observer?(.reconnectScheduled(slot: index, delay: delay))
            await shutdown.sleep(for: delay)
        }
        return nil
    }

    /// Reads stanzas until the stream ends or receiving stops; true if CCS drained it.
    private func serve(_ connection: XMPPConnection) async -> Bool {
        var drained = false
        while let received = await connection.nextReceived() {
            if await handle(received, on: connection) { drained = true }
        }
        return drained
    }

    /// Returns true when CCS announced it is draining this connection. The connection's
    /// thread already decoded the stanza and, where the mode says so, acked it.
    private func handle(_ received: ReceivedStanza, on connection: XMPPConnection) async -> Bool {
        let stanza = received.element
        if stanza.name == "message", stanza.attribute("type") == "error" {
            let condition = stanza.child("error")?.elements.first?.name ?? "unknown"
            let text = stanza.child("error")?.child("text")?.text ?? ""
            logger.warning("stanza error for id \(stanza.attribute("id") ?? "?"): \(condition) \(text)")
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
            await pipeline.submit(UpstreamWork(kind: .deadLetter(.init(
                rawPayload: payload, reason: "unreadable", error: error.description, attempts: 0, receivedAt: receivedAt))))
            return false
        }
        switch message {
        case .upstream(let upstream):
            guard let messageID = upstream.messageID, let from = upstream.from else {
                logger.warning("cannot ack a message without message_id or from; dead-lettered: \(payload.prefix(200))")
                observer?(.unackable(slot: index, raw: payload))
                await pipeline.submit(UpstreamWork(kind: .deadLetter(.init(
                    messageID: upstream.messageID, from: upstream.from, category: upstream.category, rawPayload: payload,
                    reason: "unackable", error: "missing \(upstream.messageID == nil ? "message_id" : "from")",
                    attempts: 0, receivedAt: receivedAt))))
                return false
            }
            var work = UpstreamWork(kind: .message(UpstreamMessage(
                messageID: messageID, from: from, category: upstream.category, rawData: upstream.data,
                raw: upstream.raw, rawPayload: payload, connection: label, receivedAt: receivedAt)))
            if intercepted.acked {
                observer?(.acked(slot: index, messageID: messageID, message: message))
            } else {
                let ack = CCSStanza.ack(to: from, messageID: messageID)
                work.ack = { [self] in await send(ack, messageID: messageID, on: connection, message: message) }
            }
            await pipeline.submit(work)
        case .receipt(let receipt):
            if intercepted.acked, let messageID = receipt.messageID {
                observer?(.acked(slot: index, messageID: messageID, message: message))
            } else {
                logger.warning("a receipt without message_id or from: \(payload.prefix(200))")
            }
        case .ack(let messageID, _, _):
            logger.debug("CCS acked \(messageID)")
        case .nack(let messageID, _, let error, let description, _):
            logger.warning("CCS nacked \(messageID): \(error) \(description ?? "")")
        case .control(let type):
            if type == "CONNECTION_DRAINING" {
                logger.info("CCS is draining this connection; a new one opens when it closes")
                return true
            }
            logger.info("control message \(type)")
        }
        return false
    }

    private func send(_ ack: String, messageID: String, on connection: XMPPConnection, message: CCSMessage) async {
        do {
            try await connection.send(serialized: ack)
            observer?(.acked(slot: index, messageID: messageID, message: message))
        } catch {
            logger.warning("could not ack \(messageID): \(error); CCS will redeliver it")
        }
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
    case replayed(count: Int)
}

/// Receives `WorkerEvent`s as they happen, from any task.
public typealias WorkerObserver = @Sendable (WorkerEvent) -> Void
