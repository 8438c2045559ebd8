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
import TestSupport

/// A worker serving the HTTPS ingress (TLS from a certificate of the test's CA, ID tokens
/// checked against the v1 simulator's published keys), with a client that trusts the CA.
struct IngressSetup {
    let ccs: TestCCS
    let v1: FCMV1Simulator
    let database: TestDatabase
    /// The database's name when it is one of its own (`dedicated`), for cutting it off.
    let databaseName: String?
    let folder: String
    var configuration: WorkerConfiguration

    init(ackMode: CCSAckMode = .immediate, auth: IngressSettings.Authentication = .idToken, dedicated: Bool = false) async throws {
        ccs = try TestCCS()
        v1 = try FCMV1Simulator(identity: try ccs.authority.issueServerIdentity())
        if dedicated {
            let (database, name) = try await TestDatabase.makeDedicated()
            (self.database, databaseName) = (database, name)
        } else {
            database = try await TestDatabase.make()
            databaseName = nil
        }
        configuration = try ccs.worker(database: database)
        configuration.ackMode = ackMode
        let identity = try ccs.authority.issueServerIdentity()
        folder = FileManager.default.temporaryDirectory.appendingPathComponent("ingress-\(UUID())").path
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

    /// Starts the worker and returns it once its ingress serves, with the ingress's port.
    func serve(handlers: UpstreamHandlers? = nil) async throws -> (task: Task<Void, any Error>, events: WorkerEvents, port: Int) {
        let (task, events) = startWorker(configuration, handlers: handlers)
        try await events.wait(for: "the ingress to serve") { $0.contains { if case .servingIngress = $0 { true } else { false } } }
        return (task, events, try #require(events.ingressPort))
    }

    /// Starts the worker and returns it with a client of its ingress.
    func start(handlers: UpstreamHandlers? = nil) async throws -> (task: Task<Void, any Error>, events: WorkerEvents, client: HTTPSClient) {
        let (task, events, port) = try await serve(handlers: handlers)
        let client = try HTTPSClient(host: "127.0.0.1", port: port, trust: .caPEM(ccs.authority.rootCertificatePEM))
        return (task, events, client)
    }

    /// The simulator's devices, set to post to this setup's ingress on `port`.
    func simulatedDevices(port: Int) -> IngressDevices.Settings {
        IngressDevices.Settings(port: port, trust: .caPEM(ccs.authority.rootCertificatePEM))
    }

    func idToken(uid: String) throws -> String { try v1.firebaseTokens.idToken(uid: uid) }

    /// The flags that give `fcm-worker run` this setup's ingress on `port`.
    func processFlags(port: Int) -> [String] {
        let ingress = configuration.ingressSettings
        return ["--ack-mode", configuration.ackMode.rawValue, "--ingress-address", "127.0.0.1:\(port)",
                "--ingress-tls-cert", ingress.certificateFile!, "--ingress-tls-key", ingress.keyFile!,
                "--ingress-project-id", ingress.projectID!, "--ingress-id-token-keys-url", ingress.idTokenKeysURL,
                "--ingress-burst", "100000", "--ingress-rate", "100000"]
    }
}

extension WorkerEvents {
    /// The port the worker's ingress serves on, once it does.
    var ingressPort: Int? { all.lazy.compactMap { if case .servingIngress(let port) = $0 { port } else { nil } }.first }
}

/// A port free now (the system's choice, released at once) for a child process to listen on.
func freePort() throws -> Int {
    let listener = try TCPListener.open(host: "127.0.0.1", port: 0, nonBlocking: false)
    close(listener.fd)
    return listener.port
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
        let (task, events, client) = try await setup.start()
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
        // The retry went through the pipeline: its commit counted it as a duplicate.
        try await events.wait(for: "the retry committed as a duplicate") { events in
            events.contains { if case .committed(_, let duplicates, _) = $0 { duplicates > 0 } else { false } }
        }
        let rows = try await setup.database.query("SELECT message_id, from_token, category, data::text FROM upstream_messages")
        #expect(rows.count == 1)
        #expect(rows.first?.string(0)?.hasPrefix("https:") == true && rows.first?.string(0)?.hasSuffix(":m-1") == true)
        #expect(rows.first?.string(1) == "device-token-1")
        #expect(rows.first?.string(2) == "com.example")
        #expect(rows.first?.string(3)?.contains("hello") == true)
    }

    /// A handler sees who posted (the verified uid, the device's own id) and the message's
    /// whole payload, CCS's upstream shape with the `ingress` member, in every ack mode
    /// (journal mode writes the payload first; the others make it when it is asked for).
    @Test(arguments: [CCSAckMode.immediate, .journal, .durable])
    func aHandlerSeesWhoPostedAndTheWholePayload(mode: CCSAckMode) async throws {
        final class Seen: UpstreamHandler {
            let messages = BlockingLock<[UpstreamMessage]>([])
            func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
                messages.withLock { $0.append(message) }
            }
        }
        let setup = try await IngressSetup(ackMode: mode)
        defer { setup.stop() }
        let seen = Seen()
        var handlers = UpstreamHandlers()
        handlers.register("seen", seen)
        let (task, _, client) = try await setup.start(handlers: handlers)
        defer { task.cancel() }
        let body = #"{"message_id":"m-o","token":"device-token-o","category":"com.example","time_to_live":60,"data":{"text":"hi \"o\""}}"#
        let answer = try await client.postMessage(body, token: try setup.idToken(uid: "user-o"))
        #expect(answer.status == 200, "\(answer.body)")
        try await waitUntil("the handler saw the message") { seen.messages.withLock { !$0.isEmpty } }
        let message = try #require(seen.messages.withLock { $0.first })
        #expect(message.messageID.hasPrefix("https:") && message.messageID.hasSuffix(":m-o"))
        #expect(message.from == "device-token-o")
        #expect(message.connection == "https")
        #expect(message.ingress?.clientMessageID == "m-o")
        #expect(message.ingress?.uid == "user-o")
        #expect(message.ingress != nil && message.ingress?.appID == nil)
        let payload = try JSONParser.parse(message.rawPayload)
        #expect(payload["message_id"] == .string(message.messageID))
        #expect(payload["from"] == .string("device-token-o"))
        #expect(payload["category"] == .string("com.example"))
        #expect(payload["time_to_live"] == .number(JSONNumber(60)))
        #expect(payload["data"] == .object(["text": .string(#"hi "o""#)]))
        #expect(payload["ingress"]?["uid"] == .string("user-o"))
        #expect(payload["ingress"]?["message_id"] == .string("m-o"))
        // The same text each time it is asked for.
        #expect(message.rawPayload == message.rawPayload)
    }

    /// The simulator's devices (what the demo and the bench post with), one message a request
    /// and ten: every message answered and stored once.
    @Test(arguments: [1, 10])
    func theSimulatedDevicesPostEveryMessageOnce(batch: Int) async throws {
        var setup = try await IngressSetup(ackMode: .durable)
        setup.configuration.ingressSettings.rateBurst = 10_000
        setup.configuration.ingressSettings.ratePerSecond = 10_000
        defer { setup.stop() }
        let (task, _, port) = try await setup.serve()
        defer { task.cancel() }
        var devices = setup.simulatedDevices(port: port)
        devices.messages = 200
        devices.devices = 20
        devices.inFlight = 16
        devices.connections = 2
        devices.batch = batch
        let report = try await IngressDevices(settings: devices, issuer: setup.v1.firebaseTokens).run()
        #expect(report.posted == 200 && report.statuses == [200: 200], "\(report.summary)")
        #expect(report.outcomes == ["accepted": 200], "\(report.summary)")
        #expect(try await setup.database.count("upstream_messages") == 200)
    }

    /// A device over its rate is answered 429 with Retry-After, and the simulated device
    /// posts again then, as clients are asked to: nothing it posted is lost.
    @Test func theSimulatedDevicesPostAgainAfterA429() async throws {
        var setup = try await IngressSetup(ackMode: .durable)
        setup.configuration.ingressSettings.rateBurst = 5
        setup.configuration.ingressSettings.ratePerSecond = 20
        defer { setup.stop() }
        let (task, _, port) = try await setup.serve()
        defer { task.cancel() }
        var devices = setup.simulatedDevices(port: port)
        devices.messages = 20
        devices.devices = 1
        devices.inFlight = 8
        devices.connections = 1
        let report = try await IngressDevices(settings: devices, issuer: setup.v1.firebaseTokens).run()
        #expect(report.retried > 0, "\(report.summary)")
        #expect(report.statuses == [200: 20] && report.outcomes == ["accepted": 20], "\(report.summary)")
        #expect(try await setup.database.count("upstream_messages") == 20)
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
        // No credentials: a challenge without an error code (RFC 6750 3.1); bad ones name invalid_token.
        #expect(missing.headers["www-authenticate"]?.hasPrefix("Bearer") == true)
        #expect(missing.headers["www-authenticate"]?.contains("error=") == false, "\(missing.headers)")
        var expiredClaims = setup.v1.firebaseTokens.idTokenClaims(uid: "user-r", issuedAt: Date() - 7200)
        expiredClaims["exp"] = .number(JSONNumber(Int(Date().timeIntervalSince1970) - 3600))
        let expired = try await client.postMessage(message, token: try setup.v1.firebaseTokens.sign(expiredClaims, kind: .idToken))
        expectRefusal(expired, 401, "unauthenticated")
        #expect(expired.headers["www-authenticate"]?.contains(#"error="invalid_token""#) == true, "\(expired.headers)")
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

/// The ingress's protocols: HTTP/2 over TLS (ALPN h2), HTTP/1.1 keep-alive, plain HTTP/1.1
/// and h2c with prior knowledge for a port behind a load balancer, and its certificate
/// reloaded without dropping connections.
@Suite struct IngressProtocolTests {
    @Test func http2ClientsShareAConnectionForManyPosts() async throws {
        var setup = try await IngressSetup(ackMode: .durable)
        setup.configuration.ingressSettings.rateBurst = 50
        defer { setup.stop() }
        let (task, _, port) = try await setup.serve()
        defer { task.cancel() }
        let client = try HTTP2Client(host: "127.0.0.1", port: port, trust: .caPEM(setup.ccs.authority.rootCertificatePEM), maximumConnections: 1)
        let token = try setup.idToken(uid: "h2-user")
        try await withThrowingTaskGroup(of: Int.self) { group in
            for index in 0..<50 {
                group.addTask {
                    let body = #"{"message_id":"h2-\#(index)","token":"t","data":{"n":"\#(index)"}}"#
                    return try await client.send(method: "POST", path: "/v1/messages",
                                                 headers: ["content-type": "application/json", "authorization": "Bearer " + token],
                                                 body: Array(body.utf8)).status
                }
            }
            for try await status in group { #expect(status == 200) }
        }
        #expect(!client.fellBackToHTTP1)
        #expect(client.openConnections == 1)
        #expect(try await setup.database.count("upstream_messages") == 50)
    }

    @Test func anHTTP2BodyOverTheLimitIsAnswered413AndTheConnectionGoesOn() async throws {
        var setup = try await IngressSetup(ackMode: .durable)
        setup.configuration.ingressSettings.maximumBodyBytes = 64 << 10
        defer { setup.stop() }
        let (task, _, port) = try await setup.serve()
        defer { task.cancel() }
        let client = try HTTP2Client(host: "127.0.0.1", port: port, trust: .caPEM(setup.ccs.authority.rootCertificatePEM), maximumConnections: 1)
        let headers = ["content-type": "application/json", "authorization": "Bearer " + (try setup.idToken(uid: "big-poster"))]
        let big = #"{"message_id":"big","data":{"a":""# + String(repeating: "x", count: 200 << 10) + #""}}"#
        let refused = try await client.send(method: "POST", path: "/v1/messages", headers: headers, body: Array(big.utf8))
        #expect(refused.status == 413 && refused.body.contains("too_large"), "\(refused.status) \(refused.body)")
        // The same connection serves the next post.
        let next = try await client.send(method: "POST", path: "/v1/messages", headers: headers,
                                         body: Array(#"{"message_id":"small","data":{"a":"b"}}"#.utf8))
        #expect(next.status == 200, "\(next.body)")
        #expect(client.openConnections == 1 && client.outcomeUnknownCount == 0)
        #expect(try await setup.database.count("upstream_messages") == 1)
    }

    /// `curl` (an outside client) against a plain port: HTTP/1.1, and HTTP/2 with prior knowledge.
    @Test(arguments: ["--http1.1", "--http2-prior-knowledge"])
    func aPlainPortServesHTTP1AndH2CWithPriorKnowledge(flag: String) async throws {
        var setup = try await IngressSetup(ackMode: .durable)
        setup.configuration.ingressSettings.plain = true
        setup.configuration.ingressSettings.certificateFile = nil
        setup.configuration.ingressSettings.keyFile = nil
        defer { setup.stop() }
        let (task, _, port) = try await setup.serve()
        defer { task.cancel() }
        let curl = Process()
        curl.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
        curl.arguments = ["--silent", "--show-error", flag, "--write-out", "\n%{http_version}", "http://127.0.0.1:\(port)/v1/messages",
                          "-H", "authorization: Bearer " + (try setup.idToken(uid: "plain")), "-H", "content-type: application/json",
                          "-d", #"{"message_id":"plain-1","token":"t","data":{}}"#]
        let output = Pipe()
        curl.standardOutput = output
        curl.environment = childEnvironment()
        try launch(curl)
        let text = String(decoding: await readToEnd(output.fileHandleForReading), as: UTF8.self)
        #expect(await exitStatus(of: curl) == 0)
        #expect(text.contains(#""status":"accepted""#), "\(text)")
        #expect(text.hasSuffix(flag == "--http1.1" ? "1.1" : "2"), "\(text)")
        #expect(try await setup.database.count("upstream_messages") == 1)
    }

    @Test func aSlowRequestIsAnswered408AndTheConnectionClosed() async throws {
        var setup = try await IngressSetup()
        setup.configuration.ingressSettings.plain = true
        setup.configuration.ingressSettings.certificateFile = nil
        setup.configuration.ingressSettings.keyFile = nil
        setup.configuration.ingressSettings.requestTimeout = .milliseconds(500)
        defer { setup.stop() }
        let (task, _, port) = try await setup.serve()
        defer { task.cancel() }
        // Half a head, then nothing: a slowloris client.
        let answer = await rawExchange(port: port, sending: "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n", within: 10)
        #expect(answer.hasPrefix("HTTP/1.1 408"), "\(answer)")
        #expect(answer.contains("request_timeout"))
    }

    /// HTTP/2 (h2c from curl): a request whose body does not come is answered 408 on its
    /// stream when the request timeout passes; the connection is not held by it.
    @Test func anHTTP2RequestWhoseBodyTricklesIsAnswered408() async throws {
        var setup = try await IngressSetup()
        setup.configuration.ingressSettings.plain = true
        setup.configuration.ingressSettings.certificateFile = nil
        setup.configuration.ingressSettings.keyFile = nil
        setup.configuration.ingressSettings.requestTimeout = .milliseconds(500)
        defer { setup.stop() }
        let (task, _, port) = try await setup.serve()
        defer { task.cancel() }
        // Everything but the request's last DATA frame: its body never ends.
        let token = try setup.idToken(uid: "slow")
        let started = ContinuousClock.now
        let status = await unfinishedHTTP2Request(port: port, headers: [("authorization", "Bearer " + token), ("content-type", "application/json")],
                                                  body: #"{"message_id":"slow","data":{}}"#, within: 10)
        #expect(status == 408)
        #expect(ContinuousClock.now - started < .seconds(8), "answered at the request timeout")
    }

    @Test func aClientThatExpects100ContinueIsToldToSendItsBody() async throws {
        var setup = try await IngressSetup()
        setup.configuration.ingressSettings.plain = true
        setup.configuration.ingressSettings.certificateFile = nil
        setup.configuration.ingressSettings.keyFile = nil
        setup.configuration.ingressSettings.requestTimeout = .seconds(1)
        defer { setup.stop() }
        let (task, _, port) = try await setup.serve()
        defer { task.cancel() }
        // The whole head, asking to be told before the body: told at once. The body never
        // comes here, so the request then times out (408).
        let head = "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n"
        let answer = await rawExchange(port: port, sending: head, within: 10)
        #expect(answer.hasPrefix("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 408"), "\(answer)")
        // Head and body together: nothing to wait for, no 100, the answer.
        let whole = await rawExchange(port: port, sending: head.replacingOccurrences(of: "Content-Length: 10", with: "Content-Length: 2")
                                      .replacingOccurrences(of: "Host: x", with: "Host: x\r\nConnection: close") + "{}", within: 10)
        #expect(whole.hasPrefix("HTTP/1.1 401"), "\(whole)")
    }

    @Test func aReloadedCertificateServesNewConnectionsAndKeepsOpenOnes() async throws {
        let setup = try await IngressSetup()
        defer { setup.stop() }
        let (worker, task, events) = launchWorker(setup.configuration)
        defer { task.cancel() }
        try await events.wait(for: "the ingress to serve") { $0.contains { if case .servingIngress = $0 { true } else { false } } }
        let port = try #require(events.ingressPort)
        let oldClient = try HTTPSClient(host: "127.0.0.1", port: port, trust: .caPEM(setup.ccs.authority.rootCertificatePEM), maximumConnections: 1)
        let token = try setup.idToken(uid: "reload")
        #expect(try await oldClient.postMessage(#"{"message_id":"before","token":"t","data":{}}"#, token: token).status == 200)
        // A certificate from another authority replaces the files; SIGHUP reloads it.
        let otherAuthority = try CertificateAuthority(commonName: "the replacement CA")
        let replacement = try otherAuthority.issueServerIdentity()
        try replacement.certificateChainPEM.write(toFile: setup.configuration.ingressSettings.certificateFile!, atomically: true, encoding: .utf8)
        try replacement.privateKeyPEM.write(toFile: setup.configuration.ingressSettings.keyFile!, atomically: true, encoding: .utf8)
        worker.reloadCredentials()
        let newClient = try HTTPSClient(host: "127.0.0.1", port: port, trust: .caPEM(otherAuthority.rootCertificatePEM), maximumConnections: 1)
        try await waitUntil("a new connection gets the new certificate", within: .seconds(10)) {
            (try? await newClient.postMessage(#"{"message_id":"after","token":"t","data":{}}"#, token: token))?.status == 200
        }
        // The connection opened before the reload goes on with the old certificate.
        #expect(try await oldClient.postMessage(#"{"message_id":"kept","token":"t","data":{}}"#, token: token).status == 200)
        await setup.database.waitForRows(in: "upstream_messages", count: 3, within: .seconds(10))
        #expect(try await setup.database.count("upstream_messages") == 3)
    }
}


/// Connects to `port`, writes `text`, and reads until the server closes (or `within`
/// seconds pass), on a thread of its own; returns what was read.
func rawExchange(port: Int, sending text: String, within seconds: Int) async -> String {
    await withCheckedContinuation { continuation in
        let thread = Thread {
            guard let fd = connectedLoopbackSocket(port: port, receiveTimeout: seconds) else { return continuation.resume(returning: "") }
            defer { close(fd) }
            _ = text.withCString { send(fd, $0, strlen($0), 0) }
            var received: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                let count = recv(fd, &buffer, buffer.count, 0)
                if count <= 0 { break }
                received += buffer[..<count]
            }
            continuation.resume(returning: String(decoding: received, as: UTF8.self))
        }
        thread.start()
    }
}

/// A worker with no CCS connection at all (`--connections 0`, no sender ID, no server key):
/// the ingress is its only source, as for any deployment since CCS closed.
@Suite struct IngressOnlyTests {
    @Test func withoutCCSTheIngressIsTheSourceTheWorkerIsReadyAndXMPPRepliesWait() async throws {
        var setup = try await IngressSetup(ackMode: .durable)
        defer { setup.stop() }
        setup.configuration.connections = 0
        setup.configuration.senderID = ""
        setup.configuration.serverKey = ""
        setup.configuration.metricsAddress = "127.0.0.1:0"
        var handlers = UpstreamHandlers()
        handlers.register("store", StoreHandler())
        handlers.register("echo", EchoHandler())
        let (task, events, client) = try await setup.start(handlers: handlers)
        defer { task.cancel() }
        let answer = try await client.postMessage(#"{"message_id":"only-1","token":"device-1","data":{"text":"hi"}}"#,
                                                  token: try setup.idToken(uid: "user-1"))
        #expect(answer.status == 200 && answer.body.contains(#""status":"accepted""#), "\(answer.body)")
        #expect(try await setup.database.count("upstream_messages") == 1)
        let port = try #require(events.all.compactMap { if case .serving(let port) = $0 { port } else { nil } }.first)
        let ready = try await httpGet(port: port, path: "/readyz")
        #expect(ready.status == 200 && ready.body.contains("HTTPS ingress"), "\(ready.body)")
        #expect(setup.ccs.simulator.boundSessions.isEmpty, "no CCS session was opened")
        // The echo's reply names no transport (xmpp, the outbox's default): with no CCS
        // connection it waits, counted as a row this worker cannot send, and is never failed.
        try await waitUntil("the reply counted as unsendable", within: .seconds(10)) {
            (try? await httpGet(port: port, path: "/metrics"))?.body.contains(#"fcm_worker_outbox_unsendable_rows{transport="xmpp"} 1"#) == true
        }
        let rows = try await setup.database.query("SELECT transport, status FROM downstream_messages")
        #expect(rows.map { [$0.string(0), $0.string(1)] } == [["xmpp", "pending"]])
    }
}

/// Sends an HTTP/2 request over plain TCP (h2c with prior knowledge), all of it but its last
/// DATA frame, and returns the `:status` of the answer (0 when none came within `seconds`).
func unfinishedHTTP2Request(port: Int, headers: [(name: String, value: String)], body: String, within seconds: Int) async -> Int {
    await withCheckedContinuation { continuation in
        let thread = Thread {
            guard let fd = connectedLoopbackSocket(port: port, receiveTimeout: seconds) else { return continuation.resume(returning: 0) }
            defer { close(fd) }
            var status = 0
            guard let session = try? HTTP2Session(role: .client, events: { event in
                if case .message(_, let message) = event { status = Int(message.header(":status") ?? "") ?? 0 }
            }) else { return continuation.resume(returning: 0) }
            let request = HTTP2Session.Message(headers: [(":method", "POST"), (":scheme", "http"), (":authority", "127.0.0.1"),
                                                         (":path", "/v1/messages")] + headers, body: Array(body.utf8))
            _ = try? session.submitRequest(request)
            var bytes = session.output()
            // Frames: 3 bytes of length, a type, flags, 4 bytes of stream id. Drop the last DATA.
            var offset = 24  // the connection preface
            var lastData: Range<Int>?
            while offset + 9 <= bytes.count {
                let length = Int(bytes[offset]) << 16 | Int(bytes[offset + 1]) << 8 | Int(bytes[offset + 2])
                if bytes[offset + 3] == 0 { lastData = offset..<(offset + 9 + length) }
                offset += 9 + length
            }
            if let lastData { bytes.removeSubrange(lastData) }
            _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
            var buffer = [UInt8](repeating: 0, count: 4096)
            while status == 0 {
                let count = recv(fd, &buffer, buffer.count, 0)
                if count <= 0 { break }
                buffer.withUnsafeBytes { try? session.receive(UnsafeRawBufferPointer(rebasing: $0[..<count])) }
                let reply = session.output()
                if !reply.isEmpty { _ = reply.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) } }
            }
            continuation.resume(returning: status)
        }
        thread.start()
    }
}
