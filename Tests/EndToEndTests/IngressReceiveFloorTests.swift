import Foundation
import Simulator
import Testing
import Transport
import Benchmarks

/// The upstream benchmark's ingress floor counts what it claims: every recorded request is
/// decrypted and received whole by a server session (its headers, the token among them, and
/// its body as sent) and answered, whatever the window of streams open at once.
@Suite struct IngressReceiveFloorTests {
    @Test(arguments: [1, 7, 32])
    func everyRequestIsDecryptedReceivedWholeAndAnswered(window: Int) throws {
        let authority = try CertificateAuthority()
        let server = try TLSContext.server(identity: try authority.issueServerIdentity())
        let client = try TLSContext.client(trust: .caPEM(authority.rootCertificatePEM))
        let count = 250
        let requests = (0..<count).map { number in
            IngressReceiveFloor.Request(path: number % 5 == 0 ? "/v1/messages:batch" : "/v1/messages",
                                        headers: [("content-type", "application/json"),
                                                  ("authorization", "Bearer device-\(number % 9)." + String(repeating: "x", count: 900))],
                                        body: Array(#"{"message_id":"m-\#(number)","data":{"n":"\#(number)"}}"#.utf8))
        }
        let recording = try IngressReceiveFloor.record(requests: requests, window: window, server: server, client: client, serverName: "localhost")
        #expect(recording.requests == count)
        let outcome = try IngressReceiveFloor.replay(recording, keepingRequests: true)

        #expect(outcome.requests == count)
        #expect(outcome.bodyBytes == requests.reduce(0) { $0 + $1.body.count })
        #expect(outcome.answerRecordBytes > count * 40, "every answer went out: \(outcome.answerRecordBytes) bytes")
        // As sent (the streams of a window may complete in any order).
        func describe(_ path: String?, _ method: String?, _ authorization: String?, _ body: [UInt8]) -> String {
            "\(method ?? "-") \(path ?? "-") \(authorization ?? "-") \(String(decoding: body, as: UTF8.self))"
        }
        let sent = requests.map { describe($0.path, "POST", $0.headers[1].value, $0.body) }.sorted()
        let got = outcome.received.map { describe($0.header(":path"), $0.header(":method"), $0.header("authorization"), $0.body) }.sorted()
        #expect(got == sent)
    }
}
