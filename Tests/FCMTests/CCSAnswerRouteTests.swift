@testable import FCM
import Foundation
import Runtime
import Testing

/// The one route of a connection's answers to the sender, as the connection's thread drives
/// it: a read's answers go together once the read is parsed, in order; what is read before
/// the connection has its link waits for it.
@Suite struct CCSAnswerRouteTests {
    /// A sender that records what it is told.
    private final class RecordingLinks: CCSLinks {
        let calls = BlockingLock<[String]>([])
        func attach(_ connection: CCSConnection) -> Int { 0 }
        func drain(_ link: Int) { calls.withLock { $0.append("drain \(link)") } }
        func detach(_ link: Int) { calls.withLock { $0.append("detach \(link)") } }
        func received(_ answers: [DownstreamAnswer], on link: Int) {
            let names = answers.map { answer -> String in
                switch answer {
                case .ack(let id, _): "ack \(id)"
                case .nack(let id, let code, _): "nack \(id) \(code)"
                case .stanzaError(let id, let condition, _): "error \(id) \(condition)"
                case .stanzaErrorForMessage(let id, let condition, _): "error for \(id) \(condition)"
                case .receipt(let original, _): "receipt \(original)"
                }
            }
            calls.withLock { $0.append("on \(link): " + names.joined(separator: ", ")) }
        }
        var answerTimeout: Duration { .seconds(60) }
    }

    private static func receipt(for original: String) throws -> CCSInbound {
        let json = #"{"message_type":"receipt","message_id":"dr2:\#(original)","from":"gcm.googleapis.com","category":"com.example","#
            + #""data":{"message_status":"MESSAGE_SENT_TO_DEVICE","original_message_id":"\#(original)","device_registration_id":"t"}}"#
        let message = try CCSMessage.decode(json: json)
        guard case .receipt(let upstream) = message else {
            Issue.record("not decoded as a receipt: \(message)")
            return .control(type: "none")
        }
        return .receipt(upstream, receivedAt: Date())
    }

    @Test func everyKindOfAnswerOfAReadGoesTogetherInOrderAndOnlyAcksAreKeptFromTheReader() throws {
        let links = RecordingLinks()
        let route = CCSAnswerRoute(links: links)
        route.attached(to: 3)
        #expect(route.answer(.ack(messageID: "m-1", canonicalToken: nil)), "an ack is the sender's alone")
        #expect(!route.answer(.nack(messageID: "m-2", code: "BAD_REGISTRATION", description: nil)), "the reader logs a nack")
        #expect(!route.answer(.stanzaError(stanzaID: "s-3", messageID: nil, condition: "bad-request", text: nil)))
        #expect(!route.answer(.stanzaError(stanzaID: nil, messageID: "m-4", condition: "bad-request", text: nil)))
        #expect(!route.answer(try Self.receipt(for: "m-5")), "the delegate reports a receipt")
        #expect(!route.answer(.stanzaError(stanzaID: nil, messageID: nil, condition: "bad-request", text: nil)),
                "an error that names nothing is only logged")
        #expect(links.calls.withLock { $0 }.isEmpty, "nothing before the read is parsed")
        route.readEnded()
        #expect(links.calls.withLock { $0 } == [
            "on 3: ack m-1, nack m-2 BAD_REGISTRATION, error s-3 bad-request, error for m-4 bad-request, receipt m-5",
        ])
        route.readEnded()
        #expect(links.calls.withLock { $0 }.count == 1, "a read without answers tells nothing")
    }

    @Test func whatIsReadBeforeTheLinkWaitsForIt() {
        let links = RecordingLinks()
        let route = CCSAnswerRoute(links: links)
        #expect(route.answer(.ack(messageID: "early", canonicalToken: nil)))
        route.draining()
        route.readEnded()
        #expect(links.calls.withLock { $0 }.isEmpty)
        route.attached(to: 7)
        #expect(links.calls.withLock { $0 } == ["on 7: ack early", "drain 7"])
        route.draining()
        #expect(links.calls.withLock { $0 }.last == "drain 7")
        #expect(links.calls.withLock { $0 }.count == 3)
    }
}
