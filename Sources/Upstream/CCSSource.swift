import FCM
import Foundation
import Runtime

/// CCS as a source of the upstream pipeline: the delegate of the `CCSClient` that owns the
/// connections (the outbox sends on them through the client's `CCSLinks`). Every upstream
/// message of a read goes to the pipeline, its ack already written or waiting for the
/// commit or the journal; unusable stanzas go as dead letters; each slot's events are
/// counted and reported.
package final class CCSSource: CCSClientDelegate {
    private let pipeline: UpstreamPipeline
    private let logger: Logger
    private let observer: WorkerObserver?
    private let metrics: any UpstreamMetrics

    package init(pipeline: UpstreamPipeline, logger: Logger, observer: WorkerObserver?, metrics: any UpstreamMetrics) {
        self.pipeline = pipeline
        self.logger = logger
        self.observer = observer
        self.metrics = metrics
    }

    package func slot(_ slot: Int, did event: CCSClientEvent) {
        switch event {
        case .connected(let jid):
            metrics.connection(.connected(slot: slot, jid: jid))
            observer?(.connected(slot: slot, jid: jid))
        case .connectFailed(let error):
            metrics.connectFailed()
            observer?(.disconnected(slot: slot, reason: error))
        case .disconnected(let reason):
            metrics.connection(.disconnected(slot: slot, reason: reason))
            observer?(.disconnected(slot: slot, reason: reason))
        case .reconnectScheduled(let delay):
            observer?(.reconnectScheduled(slot: slot, delay: delay))
        case .draining:
            metrics.drained()
        }
    }

    /// Hands a read's upstream work to the pipeline together (waiting for room: the
    /// connection is not read meanwhile).
    package func received(_ batch: [CCSInbound], slot: Int, on connection: CCSConnection) async {
        let work = collect(batch, slot: slot, on: connection)
        metrics.read(received: work.count, acked: work.count(where: \.isAcked))
        if !work.isEmpty { await pipeline.submit(work) }
    }

    /// The batch's work for the pipeline. Not async, and each stanza read where it lies:
    /// iterated in the async `received`, each was copied into its frame first.
    @inline(never)
    private func collect(_ batch: [CCSInbound], slot: Int, on connection: CCSConnection) -> [UpstreamWork] {
        var work: [UpstreamWork] = []
        work.reserveCapacity(batch.count)
        batch.withUnsafeBufferPointer { buffer in
            for index in buffer.indices { take((buffer.baseAddress! + index).pointee, slot: slot, on: connection, into: &work) }
        }
        return work
    }

    private func take(_ inbound: CCSInbound, slot: Int, on connection: CCSConnection, into work: inout [UpstreamWork]) {
        switch inbound {
        case .upstream(let arrival):
            work.append(UpstreamWork(arrival))
            if case .sent = arrival.ack { observer?(.acked(connection: connection.label, messageID: arrival.messageID)) }
        case .receipt(let receipt, _):
            // The outbox has it already (an answer, from the connection's thread).
            if let messageID = receipt.messageID, receipt.from != nil {
                observer?(.acked(connection: connection.label, messageID: messageID))
            } else {
                logger(slot).warning("a receipt without message_id or from: \(receipt.json.prefix(200))")
            }
        case .unusable(let message):
            switch message.reason {
            case .unackable:
                logger(slot).warning("cannot ack a message without message_id or from; dead-lettered: \(message.payload.prefix(200))")
                observer?(.unackable(slot: slot, raw: message.payload))
            case .unreadable, .unknownType:
                logger(slot).warning("unusable CCS message, dead-lettered: \(message.detail)")
                observer?(.unreadable(slot: slot, reason: message.detail))
            case .oversized:
                logger(slot).warning("oversized CCS message \(message.messageID.map { String($0.prefix(200)) } ?? "(no message_id)"), "
                                     + "dead-lettered: \(message.detail)")
                observer?(.unreadable(slot: slot, reason: message.detail))
            }
            if case .sent = message.ack, let messageID = message.messageID {
                observer?(.acked(connection: connection.label, messageID: messageID))
            }
            work.append(UpstreamWork(message))
        case .ack, .nack, .stanzaError, .control, .ignored:
            // The client's: answers went to the outbox, and it logged what needs saying.
            break
        }
    }

    private func logger(_ slot: Int) -> Logger { logger.labeled("ccs#\(slot)").with(["connection": "ccs#\(slot)"]) }
}
