import FCM
import XMPP

/// Keeps one CCS connection alive: connects, serves it until it ends, and reconnects with
/// exponential backoff and full jitter. Stops (throws) only for configuration errors
/// (credentials or certificate refused), which retrying cannot fix.
struct CCSConnectionSlot: Sendable {
    let index: Int
    let configuration: WorkerConfiguration
    let tls: TLSContext
    let logger: Logger
    let observer: WorkerObserver?

    /// Runs until the task is cancelled (then closes the stream gracefully and returns).
    func run() async throws {
        var backoff = ReconnectBackoff(base: configuration.reconnectBase, cap: configuration.reconnectCap)
        while !Task.isCancelled {
            let started = ContinuousClock.now
            var reconnectAtOnce = false
            do {
                let connection = try await XMPPConnection.connect(configuration.xmppClient, tls: tls, label: "ccs#\(index)")
                logger.info("connected to \(configuration.host):\(configuration.port), bound as \(connection.boundJID)")
                observer?(.connected(slot: index, jid: connection.boundJID))
                let outcome = await serve(connection)
                backoff.sessionEnded(after: .now - started)
                if Task.isCancelled { return }
                reconnectAtOnce = outcome.drained
                logger.warning("connection ended: \(outcome.reason)")
                observer?(.disconnected(slot: index, reason: outcome.reason))
            } catch let error as XMPPError where error.isConfigurationError {
                logger.error("\(error)")
                throw error
            } catch let error as XMPPError {
                if Task.isCancelled { return }
                logger.warning("connecting failed: \(error)")
                observer?(.disconnected(slot: index, reason: error))
            } catch {
                if Task.isCancelled { return }
                logger.warning("connecting failed: \(error)")
            }
            let delay = reconnectAtOnce ? .zero : backoff.nextDelay()
            logger.info(reconnectAtOnce ? "reconnecting now (the old connection was drained)"
                                        : "reconnecting in \(delay.formattedSeconds) (attempt \(backoff.attempt))")
            observer?(.reconnectScheduled(slot: index, delay: delay))
            do {
                try await Task.sleep(for: delay)
            } catch {
                return
            }
        }
    }

    private struct Outcome {
        var reason: XMPPError
        var drained: Bool
    }

    /// Reads stanzas until the stream ends; acks upstream messages and receipts at once.
    private func serve(_ connection: XMPPConnection) async -> Outcome {
        var drained = false
        await withTaskCancellationHandler {
            while let stanza = await connection.next() {
                if await handle(stanza, on: connection) { drained = true }
            }
        } onCancel: {
            connection.requestClose()
        }
        return Outcome(reason: await connection.closed(), drained: drained)
    }

    /// Returns true when CCS announced it is draining this connection.
    private func handle(_ stanza: XMLElement, on connection: XMPPConnection) async -> Bool {
        if stanza.name == "message", stanza.attribute("type") == "error" {
            let condition = stanza.child("error")?.elements.first?.name ?? "unknown"
            let text = stanza.child("error")?.child("text")?.text ?? ""
            logger.warning("stanza error for id \(stanza.attribute("id") ?? "?"): \(condition) \(text)")
            return false
        }
        guard let payload = CCSStanza.payload(of: stanza) else {
            logger.debug("ignored stanza <\(stanza.name)>")
            return false
        }
        let message: CCSMessage
        do {
            message = try CCSMessage.decode(json: payload)
        } catch {
            logger.warning("unreadable CCS message: \(error)")
            observer?(.unreadable(slot: index, reason: error.description))
            return false
        }
        switch message {
        case .upstream(let upstream), .receipt(let upstream):
            guard let messageID = upstream.messageID, let from = upstream.from else {
                logger.warning("cannot ack a message without message_id or from: \(upstream.raw.serialized.prefix(200))")
                observer?(.unackable(slot: index, raw: upstream.raw.serialized))
                return false
            }
            do {
                try await connection.send(serialized: CCSStanza.ack(to: from, messageID: messageID))
            } catch {
                logger.warning("could not ack \(messageID): \(error); CCS will redeliver it")
                return false
            }
            logger.debug("acked \(messageID) from \(from)")
            observer?(.acked(slot: index, messageID: messageID, message: message))
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
}

/// What the worker did, for tests and embedding applications.
public enum WorkerEvent: Sendable {
    case connected(slot: Int, jid: String)
    case disconnected(slot: Int, reason: XMPPError)
    case reconnectScheduled(slot: Int, delay: Duration)
    case acked(slot: Int, messageID: String, message: CCSMessage)
    case unackable(slot: Int, raw: String)
    case unreadable(slot: Int, reason: String)
}

/// Receives `WorkerEvent`s as they happen, from any task.
public typealias WorkerObserver = @Sendable (WorkerEvent) -> Void
