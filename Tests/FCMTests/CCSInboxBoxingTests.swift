import FCM
import Foundation
import Testing
import XMPP

/// What a CCS connection's inbox holds for each kind of inbound, and that it opens again
/// as it went in.
@Suite struct CCSInboxBoxingTests {
    private let interceptor = CCSInterceptor.immediateWithoutConnection()

    private func message(_ id: String) -> CCSUpstreamMessage {
        CCSUpstreamMessage(messageID: id, from: "device-1", category: "com.example", dataJSON: "{\"k\":\"v\"}",
                           json: "{\"message_id\":\"\(id)\",\"from\":\"device-1\",\"data\":{\"k\":\"v\"}}", connection: "ccs#0.0",
                           receivedAt: Date(timeIntervalSince1970: 1_700_000_000))
    }

    @Test func anUpstreamMessageAckedAtOnceTravelsAsItselfAndOpensAsSent() {
        let sent = message("m-1")
        let item = interceptor.box(.upstream(CCSUpstreamArrival(message: sent, ack: .sent)))
        #expect(ObjectIdentifier(item) == ObjectIdentifier(sent))
        guard case .upstream(let arrival) = CCSInterceptor.unbox(item), case .sent = arrival.ack else {
            Issue.record("opened as something else")
            return
        }
        #expect(ObjectIdentifier(arrival.message) == ObjectIdentifier(sent))
    }

    @Test func anUpstreamMessageWhoseAckWaitsKeepsItsAckInABox() {
        let waiting = message("m-2")
        let item = interceptor.box(.upstream(CCSUpstreamArrival(message: waiting, ack: .afterJournal(segment: 7))))
        #expect(!(item is CCSUpstreamMessage))
        guard case .upstream(let arrival) = CCSInterceptor.unbox(item), case .afterJournal(let segment) = arrival.ack else {
            Issue.record("opened as something else")
            return
        }
        #expect(ObjectIdentifier(arrival.message) == ObjectIdentifier(waiting))
        #expect(segment == 7)
    }

    @Test func everyOtherInboundOpensAsItWentIn() {
        let inbounds: [CCSInbound] = [
            .ack(messageID: "d-1", canonicalToken: nil),
            .nack(messageID: "d-2", code: "BAD_REGISTRATION", description: "gone"),
            .control(type: "CONNECTION_DRAINING"),
            .upstream(CCSUpstreamArrival(message: message("m-3"), ack: .impossible)),
        ]
        for inbound in inbounds {
            let opened = CCSInterceptor.unbox(interceptor.box(inbound))
            #expect(String(describing: opened) == String(describing: inbound))
        }
    }
}
