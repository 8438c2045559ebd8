import Foundation
import Runtime

/// The one route from a connection's thread to `CCSLinks`, used as the thread parses
/// (`CCSClient` gives each connection one): that CCS drains the connection (no send is placed on it once the control message is parsed), and every
/// answer about downstream messages (acks, nacks, stanza errors, delivery receipts), which
/// then free their slots without a trip through the reading task (at a moderate rate, a
/// wakeup of that task for nearly every ack) and while that task waits for room in the
/// upstream pipeline. The answers of one read go together: one lock of the sender, one
/// refill of the link. What is read before the connection has its link waits for it.
///
/// Acks are taken; nacks and stanza errors are queued for the reading task too, which logs
/// them, and receipts, which the delegate reports.
final class CCSAnswerRoute: Sendable {
    private struct State {
        var link: Int?
        /// Answers of the read being parsed (or read before the link), for `readEnded`.
        var answers: [DownstreamAnswer] = []
        /// Draining announced before the link.
        var draining = false
    }

    private let links: any CCSLinks
    private let state = BlockingLock(State())

    init(links: any CCSLinks) {
        self.links = links
    }

    /// The connection has its link: what was read before goes to it now.
    func attached(to link: Int) {
        let (answers, draining) = state.withLock { state -> ([DownstreamAnswer], Bool) in
            state.link = link
            var taken: [DownstreamAnswer] = []
            swap(&taken, &state.answers)
            return (taken, state.draining)
        }
        if !answers.isEmpty { links.received(answers, on: link) }
        if draining { links.drain(link) }
    }

    func draining() {
        let link = state.withLock { state -> Int? in
            if state.link == nil { state.draining = true }
            return state.link
        }
        if let link { links.drain(link) }
    }

    /// Keeps an answer for the sender until the read has been parsed; true when the
    /// reading task need not see it (an ack).
    func answer(_ inbound: CCSInbound) -> Bool {
        let answer: DownstreamAnswer
        switch inbound {
        case .ack(let messageID, let canonical):
            answer = .ack(messageID: messageID, canonicalToken: canonical)
        case .nack(let messageID, let code, let description):
            answer = .nack(messageID: messageID, code: code, description: description)
        case .stanzaError(let stanzaID?, _, let condition, let text):
            answer = .stanzaError(stanzaID: stanzaID, condition: condition, text: text)
        case .stanzaError(nil, let messageID?, let condition, let text):
            answer = .stanzaErrorForMessage(messageID: messageID, condition: condition, text: text)
        case .receipt(let receipt, let receivedAt):
            guard let original = receipt.data["original_message_id"]?.stringValue else { return false }
            answer = .receipt(originalMessageID: original, receivedAt: receivedAt)
        default:
            return false
        }
        state.withLock { $0.answers.append(answer) }
        if case .ack = answer { return true }
        return false
    }

    /// The read is parsed: its answers go to the sender together.
    func readEnded() {
        let (link, answers) = state.withLock { state -> (Int?, [DownstreamAnswer]) in
            guard let link = state.link else { return (nil, []) }
            var taken: [DownstreamAnswer] = []
            swap(&taken, &state.answers)
            return (link, taken)
        }
        if let link, !answers.isEmpty { links.received(answers, on: link) }
    }
}
