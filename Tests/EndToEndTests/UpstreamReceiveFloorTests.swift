import FCM
import Foundation
import Simulator
import Testing
import Transport
import Benchmarks

/// The upstream benchmark's floor phase counts what it claims: every recorded stanza is
/// decrypted, parsed and decoded, every upstream message acked (as CCS expects the ack) and
/// encoded as the `store` handler's COPY row, whatever the window cut the records into.
@Suite struct UpstreamReceiveFloorTests {
    private static func contexts() throws -> (server: TLSContext, client: TLSContext) {
        let authority = try CertificateAuthority()
        return (try TLSContext.server(identity: try authority.issueServerIdentity()),
                try TLSContext.client(trust: .caPEM(authority.rootCertificatePEM)))
    }

    @Test(arguments: [1, 7, 100])
    func everyMessageIsDecryptedDecodedAckedAndEncodedAsACopyRow(window: Int) throws {
        let (server, client) = try Self.contexts()
        let count = 250
        var stanzas = (0..<count).map { number in
            CCSSimulator.UpstreamRecord(messageID: "m-\(number)", from: "device-\(number % 7)",
                                        json: #"{"category":"com.example","data":{"n":"\#(number)","tab":"a\tb"},"#
                                            + #""from":"device-\#(number % 7)","message_id":"m-\#(number)"}"#).stanza
        }
        // A receipt is acked too but is no upstream message; a stanza of another kind neither.
        stanzas.insert(CCSStanza.message(json: #"{"message_type":"receipt","message_id":"dr2:x","from":"gcm.googleapis.com","#
                                            + #""category":"com.example","data":{"message_status":"MESSAGE_SENT_TO_DEVICE","#
                                            + #""original_message_id":"x","device_registration_id":"t"}}"#), at: 100)
        stanzas.insert("<iq type=\"get\" id=\"p\"><ping xmlns=\"urn:xmpp:ping\"/></iq>", at: 3)
        let recording = try UpstreamReceiveFloor.record(stanzas: stanzas, window: window, server: server, client: client,
                                                        serverName: "localhost")
        #expect(recording.stanzas == count + 2)
        let outcome = try UpstreamReceiveFloor.replay(recording, keepingRows: true)

        #expect(outcome.messages == count)
        #expect(outcome.others == 2)
        let expectedAcks = (0..<count).map { CCSStanza.ack(to: "device-\($0 % 7)", messageID: "m-\($0)") }
        let acks = String(decoding: outcome.acks, as: UTF8.self)
        #expect(acks == expectedAcks[..<100].joined() + CCSStanza.ack(to: "gcm.googleapis.com", messageID: "dr2:x")
                    + expectedAcks[100...].joined())
        #expect(outcome.ackBytes == outcome.acks.count)
        // Encrypted: every record adds its header and tag.
        #expect(outcome.ackRecordBytes > outcome.ackBytes)

        let rows = String(decoding: outcome.copyRows, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false)
        #expect(rows.count == count + 1 && rows.last == "")
        #expect(outcome.copyBytes == outcome.copyRows.count)
        for (number, row) in rows.dropLast().enumerated() {
            let columns = row.split(separator: "\t", omittingEmptySubsequences: false)
            #expect(columns.count == 5)
            #expect(Array(columns.prefix(4)) == ["m-\(number)", "device-\(number % 7)", "com.example",
                                                  #"{"n":"\#(number)","tab":"a\\tb"}"#])
        }
    }

    /// The floor's TLS is the worker's: a certificate for another name is refused.
    @Test func theClientEndVerifiesTheServerAsTheWorkerDoes() throws {
        let (server, client) = try Self.contexts()
        #expect(throws: TransportError.self) {
            try UpstreamReceiveFloor.record(stanzas: [], server: server, client: client, serverName: "fcm-xmpp.googleapis.com")
        }
    }
}
