import FCM
import Foundation
import Simulator
import Testing

/// A simulator that runs for days (`fcm-worker simulate`) keeps no copy of what it answered,
/// as its memory would grow with every message; it answers and counts as before. Tests'
/// simulators keep them for their checks.
@Suite struct SimulatorRecordingTests {
    @Test func theV1APIAnswersAndCountsWithoutKeepingTheMessages() async throws {
        let authority = try CertificateAuthority()
        for records in [true, false] {
            var settings = FCMV1Simulator.Settings()
            settings.recordsDeliveries = records
            let simulator = try FCMV1Simulator(identity: try authority.issueServerIdentity(), settings: settings)
            defer { simulator.stop() }
            var clientSettings = FCMV1Client.Settings()
            clientSettings.host = "127.0.0.1"
            clientSettings.port = simulator.port
            clientSettings.trust = .caPEM(authority.rootCertificatePEM)
            let client = try FCMV1Client(account: simulator.account, settings: clientSettings)
            for index in 0..<3 {
                let message = try FCMV1Message.requests(target: "phone-\(index)", condition: nil, registrationIDs: nil,
                                                        payload: ["data": ["k": "v"]])[0]
                guard case .sent(let name) = try await client.send(message) else {
                    Issue.record("message \(index) was not taken (recording: \(records))")
                    continue
                }
                #expect(name.hasPrefix("projects/fcm-worker-simulator/messages/0:"))
            }
            #expect(simulator.counters.delivered == 3)
            #expect(simulator.deliveries.count == (records ? 3 : 0))
        }
    }

    @Test func theLegacyHTTPAPIAnswersWithoutKeepingTheRequests() async throws {
        let authority = try CertificateAuthority()
        for records in [true, false] {
            let simulator = try FCMHTTPSimulator(senderID: TestCCS.senderID, serverKey: TestCCS.serverKey,
                                                 identity: try authority.issueServerIdentity(), recordsRequests: records)
            defer { simulator.stop() }
            var settings = FCMHTTPClient.Settings(serverKey: TestCCS.serverKey, senderID: TestCCS.senderID)
            try settings.setEndpoint("127.0.0.1:\(simulator.port)")
            settings.trust = .caPEM(authority.rootCertificatePEM)
            let client = try FCMHTTPClient(settings: settings)
            for _ in 0..<3 {
                let response = try await client.send(LegacyHTTPMessage(target: .to("token")))
                guard case .tokens(_, let success, _, _, _) = response else {
                    Issue.record("not a token answer: \(response)")
                    continue
                }
                #expect(success == 1, "\(response)")
            }
            #expect(simulator.requests.count == (records ? 3 : 0))
        }
    }
}
