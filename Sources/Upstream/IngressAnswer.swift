import FCM
import Foundation
import Runtime
import Synchronization
import Transport

/// The answer a device waits for, sent once every message of its request is acked the way
/// the ack mode promises (journal: on disk; durable: committed): the route its messages'
/// `DurableAck`s take. One per request.
package final class IngressAnswer: UpstreamAckRoute {
    private struct State {
        /// Per message of the request, in order: its id (the pipeline's), and its status
        /// once known (`accepted`, `duplicate`, or a refusal already decided).
        var statuses: [String?]
        var waiting: Int
        var sent = false
    }

    package let label = "https"
    private let reply: HTTPServerReply
    private let clientIDs: [String]
    private let pipelineIDs: [String?]
    private let batch: Bool
    private let started: ContinuousClock.Instant
    private let metrics: IngressMetrics
    private let state: BlockingLock<State>

    /// - Parameters:
    ///   - clientIDs: each message's id as the device sent it (`?` for one that was invalid).
    ///   - pipelineIDs: each message's ingress id, nil for one refused already.
    ///   - statuses: what is known already (a refused message's), nil for those to wait for.
    init(reply: HTTPServerReply, clientIDs: [String], pipelineIDs: [String?], statuses: [String?], batch: Bool,
         started: ContinuousClock.Instant, metrics: IngressMetrics) {
        self.reply = reply
        self.clientIDs = clientIDs
        self.pipelineIDs = pipelineIDs
        self.batch = batch
        self.started = started
        self.metrics = metrics
        state = BlockingLock(State(statuses: statuses, waiting: statuses.count { $0 == nil }))
    }

    package func write(_ acks: [DurableAck]) async throws {
        try writeWithoutWaiting(acks)
    }

    package func writeWithoutWaiting(_ acks: [DurableAck]) throws {
        let done = state.withLock { state -> [String?]? in
            for ack in acks {
                // A batch may carry an id twice: each of its places is answered.
                for index in pipelineIDs.indices where pipelineIDs[index] == ack.messageID && state.statuses[index] == nil {
                    state.statuses[index] = ack.wasDuplicate ? "duplicate" : "accepted"
                    state.waiting -= 1
                    break
                }
            }
            guard state.waiting == 0, !state.sent else { return nil }
            state.sent = true
            return state.statuses
        }
        if let done { send(done) }
    }

    private func send(_ statuses: [String?]) {
        let response = Self.response(clientIDs: clientIDs, statuses: statuses.map { $0 ?? "accepted" }, batch: batch)
        metrics.answered(status: response.status, reason: "ok", after: ContinuousClock.now - started)
        reply.send(response)
    }

    /// `{"message_id": …, "status": …}`, or for a batch `{"results": [...]}`, written directly.
    static func response(clientIDs: [String], statuses: [String], batch: Bool) -> HTTPServerResponse {
        var text = batch ? #"{"results":["# : ""
        for (index, (id, status)) in zip(clientIDs, statuses).enumerated() {
            if index > 0 { text += "," }
            text += #"{"message_id":"#
            JSONValue.appendQuoted(id, to: &text)
            if status.hasPrefix("invalid:") {
                text += #","status":"invalid","error":"#
                JSONValue.appendQuoted(String(status.dropFirst(8)), to: &text)
            } else {
                text += #","status":"#
                JSONValue.appendQuoted(status, to: &text)
            }
            text += "}"
        }
        if batch { text += "]}" }
        return HTTPServerResponse(status: 200, headers: [("content-type", "application/json")], body: Array(text.utf8))
    }
}
