import FCM
import Foundation
import Simulator
import Testing

/// `fcm-worker send`, an operator's first check of credentials, against the simulated v1 API.
@Suite struct SendCommandTests {
    struct Outcome {
        let status: Int32
        let output: String
        let error: String
    }

    func send(_ arguments: [String], environment: [String: String]) throws -> Outcome {
        let process = Process()
        process.executableURL = try CommandLineTests.executable
        process.arguments = ["send"] + arguments
        process.environment = childEnvironment().merging(environment) { $1 }
        let output = Pipe(), error = Pipe()
        process.standardOutput = output
        process.standardError = error
        try launch(process)
        let outputText = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let errorText = String(decoding: error.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return Outcome(status: process.terminationStatus, output: outputText, error: errorText)
    }

    @Test func itPrintsFCMsAnswerAndExitsByIt() async throws {
        let authority = try CertificateAuthority()
        let v1 = try FCMV1Simulator(identity: try authority.issueServerIdentity())
        defer { v1.stop() }
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("send-\(UUID())").path
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        try v1.account.keyFileJSON.write(toFile: folder + "/account.json", atomically: true, encoding: .utf8)
        try authority.rootCertificatePEM.write(toFile: folder + "/ca.pem", atomically: true, encoding: .utf8)
        let environment = ["GOOGLE_APPLICATION_CREDENTIALS": folder + "/account.json", "FCM_CA_FILE": folder + "/ca.pem",
                           "FCM_V1_ENDPOINT": "127.0.0.1:\(v1.port)"]

        let sent = try send(["--token", "phone-1", "--data", "k=v", "--notification-title", "Hello"], environment: environment)
        #expect(sent.status == 0 && sent.output.hasPrefix("v1: FCM took it: projects/fcm-worker-simulator/messages/"), "\(sent)")
        let delivered = try #require(v1.deliveries.last?.message)
        #expect(delivered["token"] == "phone-1" && delivered["data"] == ["k": "v"] && delivered["notification"] == ["title": "Hello"])

        let refused = try send(["--token", "unregistered-1"], environment: environment)
        #expect(refused.status == 1 && refused.output.contains("UNREGISTERED"), "\(refused)")

        let dryRun = try send(["--topic", "news", "--dry-run"], environment: environment)
        #expect(dryRun.status == 0 && dryRun.output.contains("fake_message_id"), "\(dryRun)")

        v1.revokeKey()
        let revoked = try send(["--token", "phone-1"], environment: environment)
        #expect(revoked.status == 3 && revoked.error.contains("invalid_grant") && !revoked.error.contains("PRIVATE KEY"), "\(revoked)")

        let noTarget = try send(["--data", "k=v"], environment: environment)
        #expect(noTarget.status == 2 && noTarget.error.contains("exactly one of --token"), "\(noTarget)")
        let noAccount = try send(["--token", "a"], environment: ["FCM_V1_ENDPOINT": "127.0.0.1:\(v1.port)"])
        #expect(noAccount.status == 2 && noAccount.error.contains("service account"), "\(noAccount)")
        let unreadable = try send(["--token", "a"], environment: ["GOOGLE_APPLICATION_CREDENTIALS": folder + "/missing.json"])
        #expect(unreadable.status == 3 && unreadable.error.contains("cannot read the service-account file"), "\(unreadable)")
    }
}
