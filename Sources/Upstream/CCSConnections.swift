import FCM
import Foundation
import Outbox
import Runtime
import Synchronization
import Transport
import XMPP

/// The worker's CCS connections: `configuration.connections` slots, each keeping one
/// connection alive with a `CCSConnectionPlan` (reconnects with backoff, an immediate
/// replacement for a connection CCS drains, a stop on configuration errors).
///
/// Every upstream message goes to the pipeline (its ack already written, or waiting for
/// the commit); downstream answers, receipts and draining go to the outbox sender, which
/// sends on the connections. It runs as two services: `reading` (the slots) and `streams`
/// (the open connections), which stop at different points of the shutdown: reading stops
/// while the pipeline still commits, the streams close after it has (durable acks go out
/// on them meanwhile).
package final class CCSConnections: Sendable {
    let configuration: CCSSourceSettings
    private let tls: TLSContext
    private let logger: Logger
    private let observer: WorkerObserver?
    private let pipeline: UpstreamPipeline
    private let sender: any CCSLinks
    private let metrics: any UpstreamMetrics
    private let open = BlockingLock<[ObjectIdentifier: CCSConnection]>([:])

    package init(configuration: CCSSourceSettings, tls: TLSContext, logger: Logger, observer: WorkerObserver?,
         pipeline: UpstreamPipeline, sender: any CCSLinks, metrics: any UpstreamMetrics) {
        self.metrics = metrics
        self.configuration = configuration
        self.tls = tls
        self.logger = logger
        self.observer = observer
        self.pipeline = pipeline
        self.sender = sender
    }

    /// Connects and reads every slot until its stage stops (the slots are then cancelled);
    /// then stops receiving and hands what was already received (and acked) to the pipeline
    /// before it returns.
    /// - Throws: the configuration error that stopped a slot (refused credentials or
    ///   certificate, unknown domain).
    package var reading: some Service { Reading(connections: self) }

    /// Keeps the open connections until its stage stops, then closes them: what is queued
    /// on them (acks) is sent, then `</stream:stream>` and a TLS close_notify.
    package var streams: some Service { Streams(connections: self) }

    private struct Reading: Service {
        let connections: CCSConnections
        var name: String { "ccs reading" }
        func run(until stop: ShutdownSignal) async throws {
            try await cancellingOnRequest(stop) { [connections] in
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for index in 1...connections.configuration.connections {
                        group.addTask { try await Slot(index: index, connections: connections).run() }
                    }
                    try await group.waitForAll()
                }
            }
        }
    }

    private struct Streams: Service {
        let connections: CCSConnections
        var name: String { "ccs streams" }
        func run(until stop: ShutdownSignal) async {
            await stop.wait()
            let all = connections.open.withLock { open in
                defer { open.removeAll() }
                return Array(open.values)
            }
            // Closing waits (at most a second each) for the socket, so that queued acks leave
            // before the process ends.
            await withTaskGroup(of: Void.self) { group in
                for connection in all { group.addTask { await connection.close() } }
            }
        }
    }

    /// How many connections are open (bound, draining ones included).
    package var openCount: Int { open.withLock { $0.count } }

    fileprivate func register(_ connection: CCSConnection) {
        open.withLock { $0[ObjectIdentifier(connection)] = connection }
    }

    fileprivate func forget(_ connection: CCSConnection) {
        _ = open.withLock { $0.removeValue(forKey: ObjectIdentifier(connection)) }
    }

    /// One slot: its plan, its connection and the connections CCS still drains.
    private struct Slot {
        let index: Int
        let connections: CCSConnections
        private var configuration: CCSSourceSettings { connections.configuration }
        private var logger: Logger { connections.logger.labeled("ccs#\(index)").with(["connection": "ccs#\(index)"]) }
        private var observer: WorkerObserver? { connections.observer }
        private var sender: any CCSLinks { connections.sender }

        init(index: Int, connections: CCSConnections) {
            self.index = index
            self.connections = connections
        }

        func run() async throws {
            var plan = CCSConnectionPlan(backoff: .reconnect(base: configuration.reconnectBase, cap: configuration.reconnectCap))
            try await withThrowingTaskGroup(of: Void.self) { drainingReaders in
                var generation = 0
                var action = plan.start()
                var current: (connection: CCSConnection, link: Int)?
                while true {
                    switch action {
                    case .stop:
                        try await drainingReaders.waitForAll()
                        return
                    case .fail(let error):
                        logger.error("\(error)")
                        try await drainingReaders.waitForAll()
                        throw error
                    case .reconnect(let delay):
                        logger.info("reconnecting in \(delay.formattedSeconds) (attempt \(plan.attempt))")
                        observer?(.reconnectScheduled(slot: index, delay: delay))
                        action = await sleepUnlessCancelled(for: delay) ? .connect : plan.handle(.shutdown)
                    case .connect:
                        generation += 1
                        do {
                            current = try await connect(label: "ccs#\(index).\(generation)")
                            action = plan.handle(.connected(at: .now))
                        } catch let error as XMPPError where !Task.isCancelled {
                            if error.isCertificateRefusal {
                                // After a session (the plan reconnects): an incident, said as an error each time.
                                logger.error("connecting failed: \(error): CCS's certificate was refused (replaced, or not CCS's); "
                                             + "retrying with backoff. Check --ca-file and the network path to \(configuration.client.host)")
                            } else {
                                logger.warning("connecting failed: \(error)")
                            }
                            connections.metrics.connectFailed()
                            observer?(.disconnected(slot: index, reason: error))
                            action = plan.handle(.connectFailed(error))
                        } catch {
                            action = plan.handle(.shutdown)
                        }
                    case .serve:
                        guard let (connection, link) = current else { action = plan.handle(.shutdown); continue }
                        current = nil
                        switch await read(connection, link: link, untilDraining: true) {
                        case .draining:
                            logger.info("CCS is draining \(connection.label): opening a replacement now, reading it until CCS closes it")
                            observer?(.reconnectScheduled(slot: index, delay: .zero))
                            drainingReaders.addTask { await readWhileDraining(connection, link: link) }
                            action = plan.handle(.draining)
                        case .stopped:
                            action = plan.handle(.shutdown)
                        case .ended:
                            sender.detach(link)
                            connections.forget(connection)
                            let reason = await connection.closed()
                            logger.warning("connection \(connection.label) ended: \(reason)")
                            connections.metrics.connection(.disconnected(slot: index, reason: reason))
                            observer?(.disconnected(slot: index, reason: reason))
                            action = plan.handle(.ended(reason, at: .now))
                        }
                    }
                }
            }
        }

        private func connect(label: String) async throws -> (CCSConnection, Int) {
            let hooks = ReaderHooks(sender: sender, logger: logger)
            let connection = try await CCSConnection.connect(configuration.client, ackMode: configuration.ackMode,
                                                             journal: connections.pipeline.journal, tls: connections.tls,
                                                             label: label, onDraining: { hooks.draining() },
                                                             onAnswer: { hooks.answer($0) }, afterRead: { hooks.readEnded() })
            connections.register(connection)
            logger.info("connected to \(configuration.client.host):\(configuration.client.port) as \(connection.label), bound as \(connection.boundJID)")
            connections.metrics.connection(.connected(slot: index, jid: connection.boundJID))
            observer?(.connected(slot: index, jid: connection.boundJID))
            if ThreadPriority.takeUnreportedRefusal() {
                logger.warning("connection threads could not raise their priority (nice \(configuration.client.threadNiceness.map(String.init) ?? "-")): "
                               + "that needs root or CAP_SYS_NICE; acks may wait behind database work on busy cores "
                               + "(pass --io-niceness off to silence this)")
            }
            let link = sender.attach(connection)
            hooks.link = link
            return (connection, link)
        }

        private enum ReadOutcome { case draining, ended, stopped }

        /// Reads until the stream ends, CCS announces draining (when `untilDraining`), or
        /// the task is cancelled: then receiving stops and what was received before is
        /// still handed on (it may be acked already).
        private func read(_ connection: CCSConnection, link: Int, untilDraining: Bool) async -> ReadOutcome {
            while let batch = await connection.next(maximum: Self.readBatch) {
                if await handle(batch, on: connection, link: link) && untilDraining { return .draining }
            }
            guard Task.isCancelled else { return .ended }
            connection.stopReceiving()
            while let batch = await connection.next(maximum: Self.readBatch) {
                _ = await handle(batch, on: connection, link: link)
            }
            return .stopped
        }

        /// Reads a draining connection until CCS closes it (its upstream messages are acked
        /// on it, its pending downstream answered), then hands what is still pending on it
        /// to the other connections.
        private func readWhileDraining(_ connection: CCSConnection, link: Int) async {
            let outcome = await read(connection, link: link, untilDraining: false)
            sender.detach(link)
            guard outcome == .ended else { return }
            connections.forget(connection)
            let reason = await connection.closed()
            logger.info("drained connection \(connection.label) ended: \(reason)")
            connections.metrics.connection(.disconnected(slot: index, reason: reason))
            observer?(.disconnected(slot: index, reason: reason))
        }

        /// Stanzas taken from a connection at once: what one read turn typically completes.
        private static let readBatch = 256

        /// Handles a batch in order and hands its upstream work to the pipeline together.
        /// Returns true when it held `CONNECTION_DRAINING` (what follows it was handled too).
        private func handle(_ batch: [CCSInbound], on connection: CCSConnection, link: Int) async -> Bool {
            let (work, draining) = collect(batch, on: connection, link: link)
            connections.metrics.read(received: work.count, acked: work.count(where: \.isAcked))
            if !work.isEmpty { await connections.pipeline.submit(work) }
            return draining
        }

        /// The batch's work for the pipeline, and whether CCS said it is draining the
        /// connection. Not async, and each stanza read where it lies: iterated in the async
        /// `handle`, each was copied into its frame first.
        @inline(never)
        private func collect(_ batch: [CCSInbound], on connection: CCSConnection, link: Int) -> (work: [UpstreamWork], draining: Bool) {
            var work: [UpstreamWork] = []
            work.reserveCapacity(batch.count)
            var draining = false
            batch.withUnsafeBufferPointer { buffer in
                for index in buffer.indices where handle((buffer.baseAddress! + index).pointee, on: connection, link: link, into: &work) {
                    draining = true
                }
            }
            return (work, draining)
        }

        private func handle(_ inbound: CCSInbound, on connection: CCSConnection, link: Int, into work: inout [UpstreamWork]) -> Bool {
            switch inbound {
            case .upstream(let arrival):
                work.append(UpstreamWork(arrival))
                if case .sent = arrival.ack { observer?(.acked(connection: connection.label, messageID: arrival.messageID)) }
            case .receipt(let receipt, let receivedAt):
                if let messageID = receipt.messageID, receipt.from != nil {
                    observer?(.acked(connection: connection.label, messageID: messageID))
                } else {
                    logger.warning("a receipt without message_id or from: \(receipt.json.prefix(200))")
                }
                if let original = receipt.data["original_message_id"]?.stringValue {
                    sender.receipt(originalMessageID: original, at: receivedAt)
                }
            case .ack, .nack, .stanzaError:
                // Acks are taken on the connection's thread (ReaderHooks), except one that
                // came before the connection had its link.
                ReaderHooks.deliver(inbound, on: link, to: sender, logger: logger)
            case .control(let type):
                if type == "CONNECTION_DRAINING" {
                    connections.metrics.drained()
                    sender.drain(link)
                    return true
                }
                logger.info("control message \(type)")
            case .unusable(let message):
                switch message.reason {
                case .unackable:
                    logger.warning("cannot ack a message without message_id or from; dead-lettered: \(message.payload.prefix(200))")
                    observer?(.unackable(slot: index, raw: message.payload))
                case .unreadable, .unknownType:
                    logger.warning("unusable CCS message, dead-lettered: \(message.detail)")
                    observer?(.unreadable(slot: index, reason: message.detail))
                case .oversized:
                    logger.warning("oversized CCS message \(message.messageID.map { String($0.prefix(200)) } ?? "(no message_id)"), "
                                   + "dead-lettered: \(message.detail)")
                    observer?(.unreadable(slot: index, reason: message.detail))
                }
                if case .sent = message.ack, let messageID = message.messageID {
                    observer?(.acked(connection: connection.label, messageID: messageID))
                }
                work.append(UpstreamWork(message))
            case .ignored(let stanza):
                logger.debug("ignored stanza <\(stanza.name)>")
            }
            return false
        }
    }
}

/// What the connection's thread tells the sender as it parses: that CCS drains the
/// connection (no send is placed on it once the control message is parsed), and the acks of
/// downstream messages, which then free their slots without a trip through the reading task
/// (at a moderate rate, a wakeup of that task for nearly every ack) and while that task
/// waits for room in the upstream pipeline. The acks of one read go together: one lock of
/// the sender, one refill of the link. Nacks and stanza errors, which are logged, go through
/// the reading task, so that nothing on the connection's thread waits for the log's pipe.
/// Before the connection has a link, the reading task handles them all.
private final class ReaderHooks: Sendable {
    private struct State {
        var link: Int?
        /// Acks of the read being parsed, for `readEnded`.
        var acks: [DownstreamAnswer] = []
    }

    private let sender: any CCSLinks
    private let logger: Logger
    private let state = BlockingLock(State())

    init(sender: any CCSLinks, logger: Logger) {
        self.sender = sender
        self.logger = logger
    }

    var link: Int? {
        get { state.withLock { $0.link } }
        set { state.withLock { $0.link = newValue } }
    }

    func draining() {
        if let link { sender.drain(link) }
    }

    /// True when `inbound` was an ack: kept for the sender until the read has been parsed.
    func answer(_ inbound: CCSInbound) -> Bool {
        guard case .ack(let messageID, let canonical) = inbound else { return false }
        return state.withLock { state in
            guard state.link != nil else { return false }
            state.acks.append(.ack(messageID: messageID, canonicalToken: canonical))
            return true
        }
    }

    /// The read is parsed: its acks go to the sender together.
    func readEnded() {
        let (link, acks) = state.withLock { state -> (Int?, [DownstreamAnswer]) in
            var taken: [DownstreamAnswer] = []
            swap(&taken, &state.acks)
            return (state.link, taken)
        }
        if let link, !acks.isEmpty { sender.received(acks, on: link) }
    }

    /// Hands an ack, a nack or a stanza error received on `link` to the sender.
    static func deliver(_ inbound: CCSInbound, on link: Int, to sender: any CCSLinks, logger: Logger) {
        switch inbound {
        case .ack(let messageID, let canonical):
            sender.received([.ack(messageID: messageID, canonicalToken: canonical)], on: link)
        case .nack(let messageID, let code, let description):
            logger.info("CCS nacked \(messageID): \(code) \(description ?? "")")
            sender.received([.nack(messageID: messageID, code: code, description: description)], on: link)
        case .stanzaError(let stanzaID, let messageID, let condition, let text):
            logger.warning("stanza error for id \(stanzaID ?? messageID ?? "?"): \(condition) \(text ?? "")")
            if let stanzaID {
                sender.received([.stanzaError(stanzaID: stanzaID, condition: condition, text: text)], on: link)
            } else if let messageID {
                sender.received([.stanzaErrorForMessage(messageID: messageID, condition: condition, text: text)], on: link)
            } else {
                logger.warning("a stanza error names no stanza: the message it refused is sent again once its answer is "
                               + "\(sender.answerTimeout.formattedSeconds) late")
            }
        case .upstream, .receipt, .control, .unusable, .ignored:
            break
        }
    }
}
