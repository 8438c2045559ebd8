import FCM
import Foundation
import Handlers
import Ingress
import Postgres
import Runtime
import Simulator
import Testing
import Transport
import Worker

/// A worker serving the HTTPS ingress (TLS from a certificate of the test's CA, ID tokens
/// checked against the v1 simulator's published keys), with a client that trusts the CA.
struct IngressSetup {
    let ccs: TestCCS
    let v1: FCMV1Simulator
    let database: TestDatabase
    var configuration: WorkerConfiguration

    init(ackMode: CCSAckMode = .immediate, auth: IngressSettings.Authentication = .idToken) async throws {
        ccs = try TestCCS()
        v1 = try FCMV1Simulator(identity: try ccs.authority.issueServerIdentity())
        database = try await TestDatabase.make()
        configuration = try ccs.worker(database: database)
        configuration.ackMode = ackMode
        let identity = try ccs.authority.issueServerIdentity()
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("ingress-\(UUID())").path
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        try identity.certificateChainPEM.write(toFile: folder + "/cert.pem", atomically: true, encoding: .utf8)
        try identity.privateKeyPEM.write(toFile: folder + "/key.pem", atomically: true, encoding: .utf8)
        var ingress = IngressSettings(address: "127.0.0.1:0")
        ingress.certificateFile = folder + "/cert.pem"
        ingress.keyFile = folder + "/key.pem"
        ingress.authentication = auth
        ingress.projectID = v1.firebaseTokens.projectID
        ingress.projectNumber = v1.firebaseTokens.projectNumber
        ingress.idTokenKeysURL = v1.idTokenKeysURL
        ingress.appCheckKeysURL = v1.appCheckKeysURL
        configuration.ingressSettings = ingress
    }

    func stop() {
        ccs.simulator.stop()
        v1.stop()
    }

    /// Starts the worker and returns it with a client of its ingress.
    func start(handlers: UpstreamHandlers? = nil) async throws -> (task: Task<Void, any Error>, events: WorkerEvents, client: HTTPSClient) {
        let (task, events) = startWorker(configuration, handlers: handlers)
        try await events.wait(for: "the ingress to serve") { $0.contains { if case .servingIngress = $0 { true } else { false } } }
        let port = events.all.compactMap { if case .servingIngress(let port) = $0 { port } else { nil } }.first!
        let client = try HTTPSClient(host: "127.0.0.1", port: port, trust: .caPEM(ccs.authority.rootCertificatePEM))
        return (task, events, client)
    }

    func idToken(uid: String) throws -> String { try v1.firebaseTokens.idToken(uid: uid) }
}

extension HTTPSClient {
    /// Posts `body` to `path` as JSON with `token` as the bearer.
    func postMessage(_ body: String, to path: String = "/v1/messages", token: String?, headers: [String: String] = [:]) async throws -> Response {
        var all = ["content-type": "application/json"].merging(headers) { $1 }
        if let token { all["authorization"] = "Bearer " + token }
        return try await send(method: "POST", path: path, headers: all, body: Array(body.utf8))
    }
}

@Suite struct IngressTests {
    @Test(arguments: [CCSAckMode.immediate, .journal, .durable])
    func aDevicePostsWithAnIDTokenAndItsMessageIsHandledOnce(mode: CCSAckMode) async throws {
        let setup = try await IngressSetup(ackMode: mode)
        defer { setup.stop() }
        let (task, _, client) = try await setup.start()
        defer { task.cancel() }
        let token = try setup.idToken(uid: "user-1")
        let body = #"{"message_id":"m-1","token":"device-token-1","category":"com.example","data":{"text":"hello"}}"#
        let first = try await client.postMessage(body, token: token)
        #expect(first.status == 200, "\(first.body)")
        #expect(first.body.contains(#""status":"accepted""#))
        if mode == .durable {
            // Answered only once committed.
            #expect(try await setup.database.count("upstream_messages") == 1)
        }
        await setup.database.waitForRows(in: "upstream_messages", count: 1, within: .seconds(10))
        // The retry of the same message (its answer was lost): answered again, handled once.
        let retry = try await client.postMessage(body, token: token)
        #expect(retry.status == 200)
        if mode == .durable { #expect(retry.body.contains(#""status":"duplicate""#), "\(retry.body)") }
        try await Task.sleep(for: .milliseconds(300))
        let rows = try await setup.database.query("SELECT message_id, from_token, category, data::text FROM upstream_messages")
        #expect(rows.count == 1)
        #expect(rows.first?.string(0)?.hasPrefix("https:") == true && rows.first?.string(0)?.hasSuffix(":m-1") == true)
        #expect(rows.first?.string(1) == "device-token-1")
        #expect(rows.first?.string(2) == "com.example")
        #expect(rows.first?.string(3)?.contains("hello") == true)
    }

    @Test func aSenderReusingAnotherSendersMessageIDNeitherSuppressesNorOverwritesIt() async throws {
        let setup = try await IngressSetup(ackMode: .durable)
        defer { setup.stop() }
        let (task, _, client) = try await setup.start()
        defer { task.cancel() }
        let alice = try await client.postMessage(#"{"message_id":"same","token":"alice-device","data":{"who":"alice"}}"#,
                                          token: try setup.idToken(uid: "alice"))
        let mallory = try await client.postMessage(#"{"message_id":"same","token":"alice-device","data":{"who":"mallory"}}"#,
                                            token: try setup.idToken(uid: "mallory"))
        #expect(alice.status == 200 && mallory.status == 200)
        #expect(mallory.body.contains(#""status":"accepted""#), "not a duplicate of alice's: \(mallory.body)")
        let rows = try await setup.database.query("SELECT data->>'who' FROM upstream_messages ORDER BY 1")
        #expect(rows.map { $0.string(0) } == ["alice", "mallory"])
    }

    @Test func aBatchIsAnsweredPerMessage() async throws {
        let setup = try await IngressSetup(ackMode: .durable)
        defer { setup.stop() }
        let (task, _, client) = try await setup.start()
        defer { task.cancel() }
        let body = #"{"messages":[{"message_id":"b1","token":"t","data":{"n":"1"}},{"message_id":"b2","data":{"n":2}},{"message_id":"b3","token":"t","data":{"n":"3"}}]}"#
        let answer = try await client.postMessage(body, to: "/v1/messages:batch", token: try setup.idToken(uid: "batcher"))
        #expect(answer.status == 200, "\(answer.body)")
        let results = try JSONValue.parse(answer.body)["results"]?.arrayValue ?? []
        #expect(results.map { $0["status"]?.stringValue } == ["accepted", "invalid", "accepted"])
        #expect(try await setup.database.count("upstream_messages") == 2)
    }

    @Test func refusalsSayWhyWithTheirStatusAndReason() async throws {
        var setup = try await IngressSetup()
        setup.configuration.ingressSettings.rateBurst = 3
        setup.configuration.ingressSettings.ratePerSecond = 0.1
        defer { setup.stop() }
        let (task, _, client) = try await setup.start()
        defer { task.cancel() }
        let good = try setup.idToken(uid: "user-r")
        let message = #"{"message_id":"r1","token":"t","data":{"a":"b"}}"#
        func expectRefusal(_ response: HTTPSClient.Response, _ status: Int, _ reason: String, sourceLocation: SourceLocation = #_sourceLocation) {
            #expect(response.status == status, "\(response.body)", sourceLocation: sourceLocation)
            #expect(response.body.contains(#""status":"\#(reason)""#), "\(response.body)", sourceLocation: sourceLocation)
        }
        let missing = try await client.postMessage(message, token: nil)
        expectRefusal(missing, 401, "unauthenticated")
        #expect(missing.headers["www-authenticate"]?.contains("invalid_token") == true)
        var expiredClaims = setup.v1.firebaseTokens.idTokenClaims(uid: "user-r", issuedAt: Date() - 7200)
        expiredClaims["exp"] = .number(JSONNumber(Int(Date().timeIntervalSince1970) - 3600))
        expectRefusal(try await client.postMessage(message, token: try setup.v1.firebaseTokens.sign(expiredClaims, kind: .idToken)), 401, "unauthenticated")
        var otherProject = setup.v1.firebaseTokens.idTokenClaims(uid: "user-r")
        otherProject["aud"] = "another-project"
        expectRefusal(try await client.postMessage(message, token: try setup.v1.firebaseTokens.sign(otherProject, kind: .idToken)), 403, "wrong_project")
        expectRefusal(try await client.postMessage(message, token: good, headers: ["content-type": "text/plain"]), 415, "unsupported_media_type")
        expectRefusal(try await client.postMessage("{not json", token: good), 400, "invalid_message")
        let big = String(repeating: "x", count: 5000)
        expectRefusal(try await client.postMessage(#"{"message_id":"big","data":{"a":"\#(big)"}}"#, token: good), 413, "too_large")
        expectRefusal(try await client.send(method: "POST", path: "/elsewhere", headers: ["content-type": "application/json"], body: []),
                      404, "not_found")
        // The bucket holds 3: the fourth message within the burst is refused with Retry-After.
        for index in 0..<3 {
            let answer = try await client.postMessage(#"{"message_id":"rate-\#(index)","token":"t","data":{}}"#, token: good)
            #expect(answer.status == 200, "\(answer.body)")
        }
        let limited = try await client.postMessage(#"{"message_id":"rate-4","token":"t","data":{}}"#, token: good)
        expectRefusal(limited, 429, "rate_limited")
        #expect(Int(limited.headers["retry-after"] ?? "") ?? 0 >= 1)
    }
}
