import Foundation
import Runtime
import Synchronization
import Transport
import XMPP

/// What happened to one slot's connection, for its owner's logs, metrics and events.
package enum CCSClientEvent: Sendable {
    case connected(jid: String)
    /// A connection attempt failed; the slot tries again after its backoff.
    case connectFailed(XMPPError)
    /// A connection of the slot ended (a draining one too, once CCS closed it).
    case disconnected(XMPPError)
    /// The slot connects again after `delay` (zero: CCS drains the connection and a
    /// replacement opens now).
    case reconnectScheduled(Duration)
    /// CCS announced it is draining the slot's connection.
    case draining
}

/// Takes what a `CCSClient`'s connections read for the upstream side (the worker's
/// pipeline).
package protocol CCSClientDelegate: Sendable {
    /// A read of `connection` (of slot `slot`), in order: its upstream messages, unusable
    /// stanzas and delivery receipts are for the delegate (their acks written or waiting as
    /// the ack mode says); the other kinds it passes over (the client deals with them).
    /// Returning later (the pipeline's lanes full) holds the reading of that connection.
    func received(_ batch: [CCSInbound], slot: Int, on connection: CCSConnection) async
    /// What happened to slot `slot`'s connection.
    func slot(_ slot: Int, did event: CCSClientEvent)
}

/// The one owner of the worker's CCS connections: `settings.connections` slots, each keeping
/// one connection alive with a `CCSConnectionPlan` (reconnects with backoff, an immediate
/// replacement for a connection CCS drains, a stop on configuration errors).
///
/// Each connection is handed to `links` to be sent on (`attach`), and everything it reads
/// about downstream messages (acks, nacks, stanza errors, delivery receipts) reaches `links`
/// by one route: `CCSLinks.received`, on the connection's thread, a read's worth at a time,
/// in the order read. What is for the upstream side (messages, unusable stanzas, receipts)
/// goes to `delegate` from the slot's reading task, which also logs the nacks and stanza
/// errors (off the connection's thread, which must not wait for the log's pipe).
///
/// It runs as two services: `reading` (the slots) and `streams` (the open connections),
/// which stop at different points of the shutdown: reading stops while the pipeline still
/// commits, the streams close after it has (durable acks go out on them meanwhile).
package final class CCSClient: Sendable {
    let settings: CCSClientSettings
    private let tls: TLSContext
    private let journal: (any CCSJournal)?
    private let logger: Logger
    private let links: any CCSLinks
    private let delegate: any CCSClientDelegate
    private let open = BlockingLock<[ObjectIdentifier: CCSConnection]>([:])

    package init(settings: CCSClientSettings, tls: TLSContext, journal: (any CCSJournal)?, logger: Logger, links: any CCSLinks,
                 delegate: any CCSClientDelegate) {
        self.settings = settings
        self.tls = tls
        self.journal = journal
        self.logger = logger
        self.links = links
        self.delegate = delegate
    }

    /// Connects and reads every slot until its stage stops (the slots are then cancelled);
    /// then stops receiving and hands what was already received (and acked) to the delegate
    /// before it returns.
    /// - Throws: the configuration error that stopped a slot (refused credentials or
    ///   certificate, unknown domain).
    package var reading: some Service { Reading(client: self) }

    /// Keeps the open connections until its stage stops, then closes them: what is queued
    /// on them (acks) is sent, then `</stream:stream>` and a TLS close_notify.
    package var streams: some Service { Streams(client: self) }

    private struct Reading: Service {
        let client: CCSClient
        var name: String { "ccs reading" }
        func run(until stop: ShutdownSignal) async throws {
            try await cancellingOnRequest(stop) { [client] in
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for index in 1...client.settings.connections {
                        group.addTask { try await Slot(index: index, client: client).run() }
                    }
                    try await group.waitForAll()
                }
            }
        }
    }

    private struct Streams: Service {
        let client: CCSClient
        var name: String { "ccs streams" }
        func run(until stop: ShutdownSignal) async {
            await stop.wait()
            let all = client.open.withLock { open in
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
        let client: CCSClient
        private var settings: CCSClientSettings { client.settings }
        private var logger: Logger { client.logger.labeled("ccs#\(index)").with(["connection": "ccs#\(index)"]) }
        private var links: any CCSLinks { client.links }

        init(index: Int, client: CCSClient) {
            self.index = index
            self.client = client
        }

        private func tell(_ event: CCSClientEvent) { client.delegate.slot(index, did: event) }

        func run() async throws {
            var plan = CCSConnectionPlan(backoff: .reconnect(base: settings.reconnectBase, cap: settings.reconnectCap))
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
                        tell(.reconnectScheduled(delay))
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
                                             + "retrying with backoff. Check --ca-file and the network path to \(settings.client.host)")
                            } else {
                                logger.warning("connecting failed: \(error)")
                            }
                            tell(.connectFailed(error))
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
                            tell(.reconnectScheduled(.zero))
                            drainingReaders.addTask { await readWhileDraining(connection, link: link) }
                            action = plan.handle(.draining)
                        case .stopped:
                            action = plan.handle(.shutdown)
                        case .ended:
                            links.detach(link)
                            client.forget(connection)
                            let reason = await connection.closed()
                            logger.warning("connection \(connection.label) ended: \(reason)")
                            tell(.disconnected(reason))
                            action = plan.handle(.ended(reason, at: .now))
                        }
                    }
                }
            }
        }

        private func connect(label: String) async throws -> (CCSConnection, Int) {
            let hooks = CCSAnswerRoute(links: links)
            let connection = try await CCSConnection.connect(settings.client, ackMode: settings.ackMode,
                                                             journal: client.journal, tls: client.tls,
                                                             label: label, onDraining: { hooks.draining() },
                                                             onAnswer: { hooks.answer($0) }, afterRead: { hooks.readEnded() })
            client.register(connection)
            logger.info("connected to \(settings.client.host):\(settings.client.port) as \(connection.label), bound as \(connection.boundJID)")
            tell(.connected(jid: connection.boundJID))
            if ThreadPriority.takeUnreportedRefusal() {
                logger.warning("connection threads could not raise their priority (nice \(settings.client.threadNiceness.map(String.init) ?? "-")): "
                               + "that needs root or CAP_SYS_NICE; acks may wait behind database work on busy cores "
                               + "(pass --io-niceness off to silence this)")
            }
            let link = links.attach(connection)
            hooks.attached(to: link)
            return (connection, link)
        }

        private enum ReadOutcome { case draining, ended, stopped }

        /// Reads until the stream ends, CCS announces draining (when `untilDraining`), or
        /// the task is cancelled: then receiving stops and what was received before is
        /// still handed on (it may be acked already).
        private func read(_ connection: CCSConnection, link: Int, untilDraining: Bool) async -> ReadOutcome {
            while let batch = await connection.next(maximum: Self.readBatch) {
                if await handle(batch, on: connection) && untilDraining { return .draining }
            }
            guard Task.isCancelled else { return .ended }
            connection.stopReceiving()
            while let batch = await connection.next(maximum: Self.readBatch) {
                _ = await handle(batch, on: connection)
            }
            return .stopped
        }

        /// Reads a draining connection until CCS closes it (its upstream messages are acked
        /// on it, its pending downstream answered), then hands what is still pending on it
        /// to the other connections.
        private func readWhileDraining(_ connection: CCSConnection, link: Int) async {
            let outcome = await read(connection, link: link, untilDraining: false)
            links.detach(link)
            guard outcome == .ended else { return }
            client.forget(connection)
            let reason = await connection.closed()
            logger.info("drained connection \(connection.label) ended: \(reason)")
            tell(.disconnected(reason))
        }

        /// Stanzas taken from a connection at once: what one read turn typically completes.
        private static let readBatch = 256

        /// Logs what the batch holds for the client (nacks, stanza errors, control
        /// messages), then hands it to the delegate. Returns true when it held
        /// `CONNECTION_DRAINING` (what follows it was handed on too).
        private func handle(_ batch: [CCSInbound], on connection: CCSConnection) async -> Bool {
            let draining = look(at: batch)
            await client.delegate.received(batch, slot: index, on: connection)
            return draining
        }

        /// Not async, and each stanza read where it lies: iterated in the async `handle`,
        /// each was copied into its frame first.
        @inline(never)
        private func look(at batch: [CCSInbound]) -> Bool {
            var draining = false
            batch.withUnsafeBufferPointer { buffer in
                for index in buffer.indices where look(at: (buffer.baseAddress! + index).pointee) { draining = true }
            }
            return draining
        }

        private func look(at inbound: CCSInbound) -> Bool {
            switch inbound {
            case .nack(let messageID, let code, let description):
                logger.info("CCS nacked \(messageID): \(code) \(description ?? "")")
            case .stanzaError(let stanzaID, let messageID, let condition, let text):
                logger.warning("stanza error for id \(stanzaID ?? messageID ?? "?"): \(condition) \(text ?? "")")
                if stanzaID == nil && messageID == nil {
                    logger.warning("a stanza error names no stanza: the message it refused is sent again once its answer is "
                                   + "\(links.answerTimeout.formattedSeconds) late")
                }
            case .control(let type):
                if type == "CONNECTION_DRAINING" {
                    tell(.draining)
                    return true
                }
                logger.info("control message \(type)")
            case .ignored(let stanza):
                logger.debug("ignored stanza <\(stanza.name)>")
            case .upstream, .unusable, .receipt, .ack:
                break
            }
            return false
        }
    }
}
