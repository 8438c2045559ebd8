import FCM
import Foundation
import Handlers
import Ingress
import Runtime
import Simulator
import Testing
import Transport
import Upstream
import Worker
import TestSupport

/// The ingress as a public edge, tried as an attacker and as an operator would: raw frames a
/// proxy would read otherwise, floods in one write, devices that collide, App Check's
/// unproven installs, and readiness that tells the truth.
@Suite struct IngressEdgeTests {
    /// A plain (behind a load balancer) ingress with its metrics served.
    private static func plainSetup(ackMode: CCSAckMode = .immediate, dedicated: Bool = false) async throws -> IngressSetup {
        var setup = try await IngressSetup(ackMode: ackMode, dedicated: dedicated)
        setup.configuration.ingressSettings.plain = true
        setup.configuration.ingressSettings.certificateFile = nil
        setup.configuration.ingressSettings.keyFile = nil
        setup.configuration.ingressSettings.rateBurst = 100_000
        setup.configuration.ingressSettings.ratePerSecond = 100_000
        setup.configuration.metricsAddress = "127.0.0.1:0"
        return setup
    }

    private static func metricsPort(_ events: WorkerEvents) throws -> Int {
        try #require(events.all.compactMap { if case .serving(let port) = $0 { port } else { nil } }.first)
    }

    /// Reads what `fd` answers until it closes or `until` holds.
    private static func readAnswers(_ fd: Int32, until done: (String) -> Bool = { _ in false }) -> String {
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        while !done(String(decoding: received, as: UTF8.self)) {
            let count = recv(fd, &buffer, buffer.count, 0)
            if count <= 0 { break }
            received += buffer[..<count]
        }
        return String(decoding: received, as: UTF8.self)
    }

    /// One valid POST and thousands of pipelined requests in one write (a stack overflow
    /// before: each answer took the next request from inside itself): all answered, and
    /// what was acked is stored.
    @Test func thousandsOfPipelinedRequestsInOneWriteAreAnsweredAndTheWorkerLives() async throws {
        let setup = try await Self.plainSetup()
        defer { setup.stop() }
        let (task, _, port) = try await setup.serve()
        defer { task.cancel() }
        let token = try setup.idToken(uid: "pipeliner")
        let body = #"{"message_id":"p-1","token":"t","data":{}}"#
        let burst = "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer \(token)\r\n"
            + "Content-Length: \(body.utf8.count)\r\n\r\n\(body)" + String(repeating: "GET / HTTP/1.1\r\nHost: x\r\n\r\n", count: 3000)
        let fd = try #require(connectedLoopbackSocket(port: port, receiveTimeout: 30))
        defer { close(fd) }
        let writer = Thread { _ = Array(burst.utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } }
        writer.start()
        let answers = await blockingRead { Self.readAnswers(fd) { $0.components(separatedBy: "HTTP/1.1 ").count - 1 >= 3001 } }
        #expect(answers.hasPrefix("HTTP/1.1 200"), "\(answers.prefix(200))")
        #expect(answers.components(separatedBy: "HTTP/1.1 404").count - 1 == 3000)
        await setup.database.waitForRows(in: "upstream_messages", count: 1, within: .seconds(10))
        // The worker still serves.
        #expect(try await plainPost(port: port, #"{"message_id":"p-2","token":"t","data":{}}"#, token: token).status == 200)
    }

    /// Framings a proxy in front would read otherwise are refused and the connection closed;
    /// each refusal of the HTTP layer is counted with the ingress's answers.
    @Test func smuggledFramingsAreRefusedAndCounted() async throws {
        let setup = try await Self.plainSetup()
        defer { setup.stop() }
        let (task, events, port) = try await setup.serve()
        defer { task.cancel() }
        let token = try setup.idToken(uid: "smuggler")
        let cases: [(String, String)] = [
            ("Content-Length: 3\r\nContent-Length: 44\r\n", "400"),
            ("Content-Length: 44\r\nTransfer-Encoding: chunked\r\n", "400"),
            ("Transfer-Encoding: gzip\r\n", "501"),
            ("Content-Length : 44\r\n", "400"),
            ("Authorization: Bearer \(try setup.idToken(uid: "someone-else"))\r\nContent-Length: 44\r\n", "400"),
        ]
        for (fields, status) in cases {
            let fd = try #require(connectedLoopbackSocket(port: port, receiveTimeout: 10))
            defer { close(fd) }
            let request = "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer \(token)\r\n"
                + fields + "\r\n" + #"{"message_id":"s","token":"t","data":{"a":"b"}}"#
            _ = Array(request.utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            let answer = await blockingRead { Self.readAnswers(fd) }
            #expect(answer.hasPrefix("HTTP/1.1 \(status) "), "\(fields.debugDescription): \(answer.prefix(300))")
            #expect(answer.components(separatedBy: "HTTP/1.1 ").count == 2, "one answer, then the close: \(answer.prefix(400))")
            #expect(answer.contains(#""message":"#))
        }
        #expect(try await setup.database.count("upstream_messages") == 0)
        let page = try await httpGet(port: try Self.metricsPort(events), path: "/metrics").body
        #expect(page.contains(#"fcm_worker_ingress_requests_total{status="400",reason="malformed_http"} 4"#), "\(page.split(separator: "\n").filter { $0.contains("ingress_requests") })")
        #expect(page.contains(#"fcm_worker_ingress_requests_total{status="501",reason="not_implemented"} 1"#))
    }

    /// A user's phone and tablet that number their messages alike both get theirs stored; a
    /// retry from the same device is still a duplicate.
    @Test func twoDevicesOfOneUserMayChooseTheSameMessageID() async throws {
        let setup = try await IngressSetup(ackMode: .durable)
        defer { setup.stop() }
        let (task, _, client) = try await setup.start()
        defer { task.cancel() }
        let token = try setup.idToken(uid: "two-devices")
        let phone = try await client.postMessage(#"{"message_id":"1","token":"phone","data":{"from":"phone"}}"#, token: token)
        let tablet = try await client.postMessage(#"{"message_id":"1","token":"tablet","data":{"from":"tablet"}}"#, token: token)
        #expect(phone.body.contains(#""status":"accepted""#) && tablet.body.contains(#""status":"accepted""#), "\(phone.body) \(tablet.body)")
        let retry = try await client.postMessage(#"{"message_id":"1","token":"phone","data":{"from":"phone"}}"#, token: token)
        #expect(retry.body.contains(#""status":"duplicate""#), "\(retry.body)")
        let rows = try await setup.database.query("SELECT data->>'from' FROM upstream_messages ORDER BY 1")
        #expect(rows.map { $0.string(0) } == ["phone", "tablet"])
    }

    /// An App Check token proves the app, not the install: ids must be unguessable (no
    /// install can pre-empt another's), and the bucket is the App Check token's (a new body
    /// `token` per post buys no new bucket).
    @Test func withAppCheckAloneIDsMustBeUnguessableAndTheBucketIsTheAppCheckTokens() async throws {
        var setup = try await IngressSetup(ackMode: .durable, auth: .appCheck)
        setup.configuration.ingressSettings.rateBurst = 3
        setup.configuration.ingressSettings.ratePerSecond = 0.1
        defer { setup.stop() }
        let (task, _, client) = try await setup.start()
        defer { task.cancel() }
        let appCheck = try setup.v1.firebaseTokens.appCheckToken(appID: setup.v1.firebaseTokens.sampleAppID)
        func post(_ id: String, token: String) async throws -> HTTPSClient.Response {
            try await client.postMessage(#"{"message_id":"\#(id)","token":"\#(token)","data":{}}"#, token: nil,
                                         headers: ["x-firebase-appcheck": appCheck])
        }
        let guessable = try await post("1", token: "victim-device")
        #expect(guessable.status == 400 && guessable.body.contains("unguessable"), "\(guessable.body)")
        for index in 0..<3 {
            let answer = try await post(UUID().uuidString.lowercased(), token: "device-\(index)")
            #expect(answer.status == 200, "\(answer.body)")
        }
        let limited = try await post(UUID().uuidString, token: "device-new")
        #expect(limited.status == 429, "a new body token is no new bucket: \(limited.body)")
    }

    /// At its connection limit the ingress says so: `/readyz` 503 naming the limit, the
    /// refused connection counted and logged.
    @Test func aFullIngressIsNotReadyAndCountsWhatItRefuses() async throws {
        var setup = try await Self.plainSetup()
        setup.configuration.ingressSettings.maximumConnections = 2
        defer { setup.stop() }
        let (task, events, port) = try await setup.serve()
        defer { task.cancel() }
        let metrics = try Self.metricsPort(events)
        try await waitUntil("ready", within: .seconds(20)) { (try? await httpGet(port: metrics, path: "/readyz"))?.status == 200 }
        let held = try (0..<2).map { _ in try #require(connectedLoopbackSocket(port: port, receiveTimeout: 5)) }
        defer { held.forEach { close($0) } }
        try await waitUntil("not ready at the limit", within: .seconds(10)) {
            let ready = try? await httpGet(port: metrics, path: "/readyz")
            return ready?.status == 503 && ready?.body.contains("--ingress-max-connections") == true
        }
        let third = try #require(connectedLoopbackSocket(port: port, receiveTimeout: 5))
        defer { close(third) }
        #expect(await blockingRead { Self.readAnswers(third) } == "", "closed at once")
        try await waitUntil("the refusal counted") {
            let page = (try? await httpGet(port: metrics, path: "/metrics"))?.body ?? ""
            return page.contains(#"fcm_worker_ingress_connections_refused_total{reason="full"} 1"#)
                && page.contains("fcm_worker_ingress_connections_open 2")
        }
    }

    /// No key set could be fetched: not ready (every token would be refused 503).
    @Test func withoutItsSigningKeysTheIngressIsNotReady() async throws {
        var setup = try await Self.plainSetup()
        setup.configuration.ingressSettings.idTokenKeysURL = "https://127.0.0.1:\(try freePort())/keys"
        defer { setup.stop() }
        let (task, events, _) = try await setup.serve()
        defer { task.cancel() }
        let metrics = try Self.metricsPort(events)
        try await waitUntil("readiness names the keys", within: .seconds(20)) {
            let ready = try? await httpGet(port: metrics, path: "/readyz")
            return ready?.status == 503 && ready?.body.contains("signing keys") == true
        }
    }

    /// In durable mode, while the database is down posts are refused and `/readyz` says so;
    /// once it answers again, the gate opens at once (the health probe cuts the outage's
    /// backoff short) rather than at the end of a backoff of seconds.
    @Test func inDurableModeReadinessFollowsTheDatabaseAndTheGateReopensPromptly() async throws {
        var setup = try await Self.plainSetup(ackMode: .durable, dedicated: true)
        setup.configuration.pipeline.databaseRetryBase = .seconds(10)
        setup.configuration.pipeline.databaseRetryCap = .seconds(30)
        defer { setup.stop() }
        let (task, events, port) = try await setup.serve()
        defer { task.cancel() }
        let metrics = try Self.metricsPort(events)
        let token = try setup.idToken(uid: "gate")
        #expect(try await plainPost(port: port, #"{"message_id":"g-0","token":"t","data":{}}"#, token: token).status == 200)
        try await TestDatabase.cutOff(setup.databaseName!)
        let waiting = Task { try await plainPost(port: port, #"{"message_id":"g-1","token":"t","data":{}}"#, token: token, timeout: 60) }
        try await waitUntil("not ready: the database", within: .seconds(30)) {
            let ready = try? await httpGet(port: metrics, path: "/readyz")
            return ready?.status == 503 && ready?.body.contains("database") == true
        }
        try await TestDatabase.restore(setup.databaseName!)
        let restored = ContinuousClock.now
        _ = try await waiting.value
        try await waitUntil("ready again", within: .seconds(30)) { (try? await httpGet(port: metrics, path: "/readyz"))?.status == 200 }
        let answer = try await plainPost(port: port, #"{"message_id":"g-2","token":"t","data":{}}"#, token: token)
        #expect(answer.status == 200, "\(answer.body)")
        // The lanes' next retry was up to 10 s away: the health probe (every 2 s) opened the gate sooner.
        #expect(ContinuousClock.now - restored < .seconds(6), "\(ContinuousClock.now - restored) from the restore to a 200")
    }
}

extension IngressEdgeTests {
    /// After an answer with `Connection: close` over TLS the TCP connection ends at once (its
    /// FIN right after close_notify): a client reading to the end is not kept waiting the
    /// second the worker gives a peer to close first.
    @Test func aConnectionCloseAnswerOverTLSEndsTheConnectionAtOnce() async throws {
        let setup = try await IngressSetup(ackMode: .immediate)
        defer { setup.stop() }
        let (task, _, port) = try await setup.serve()
        defer { task.cancel() }
        let token = try setup.idToken(uid: "closer")
        let context = try TLSContext.client(trust: .caPEM(setup.ccs.authority.rootCertificatePEM))
        let body = #"{"message_id":"c-1","token":"t","data":{}}"#
        let request = "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer \(token)\r\n"
            + "Connection: close\r\nContent-Length: \(body.utf8.count)\r\n\r\n" + body
        let (answer, lateness) = try await blockingRead { () -> Result<(String, Duration), TransportError> in
            do throws(TransportError) {
                let channel = try TLSChannel.connect(host: "127.0.0.1", port: port, context: context, deadline: .now + .seconds(10))
                try channel.write(Array(request.utf8), until: .now + .seconds(10))
                var received: [UInt8] = []
                var buffer = [UInt8](repeating: 0, count: 16 << 10)
                var answered: ContinuousClock.Instant?
                while true {
                    let count = try channel.read(into: &buffer, until: .now + .seconds(10))
                    if count == 0 { break }
                    if answered == nil { answered = .now }
                    received += buffer[..<count]
                }
                // TLS said it closed; now the TCP FIN, both timed from the answer.
                let closedTLS = ContinuousClock.now
                var scratch = [UInt8](repeating: 0, count: 4096)
                while ContinuousClock.now - closedTLS < .seconds(3) {
                    var descriptor = pollfd(fd: channel.fd, events: Int16(POLLIN), revents: 0)
                    guard poll(&descriptor, 1, 3000) > 0 else { break }
                    // Bytes after close_notify (none are expected) are read past; 0 is the FIN.
                    if recv(channel.fd, &scratch, scratch.count, Int32(MSG_DONTWAIT)) == 0 { break }
                }
                return .success((String(decoding: received, as: UTF8.self), ContinuousClock.now - (answered ?? closedTLS)))
            } catch {
                return .failure(error)
            }
        }.get()
        #expect(answer.hasPrefix("HTTP/1.1 200"), "\(answer.prefix(200))")
        #expect(lateness < .milliseconds(500), "the connection ended \(lateness) after its answer")
    }
}

/// Posts `body` to a plain ingress as HTTP/1.1 (`Connection: close`) and returns the
/// answer's status and body (status 0 when none came within `timeout` seconds).
func plainPost(port: Int, _ body: String, token: String, timeout: Int = 10) async throws -> (status: Int, body: String) {
    guard let fd = connectedLoopbackSocket(port: port, receiveTimeout: timeout) else { throw SimulatorError("cannot connect to the ingress on \(port)") }
    let request = "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer \(token)\r\n"
        + "Connection: close\r\nContent-Length: \(body.utf8.count)\r\n\r\n" + body
    let answer = await blockingRead { () -> String in
        defer { close(fd) }
        _ = Array(request.utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16 << 10)
        while true {
            let count = recv(fd, &buffer, buffer.count, 0)
            if count <= 0 { break }
            received += buffer[..<count]
        }
        return String(decoding: received, as: UTF8.self)
    }
    let status = answer.split(separator: " ", maxSplits: 2).dropFirst().first.flatMap { Int($0) } ?? 0
    let bodyStart = answer.range(of: "\r\n\r\n").map { String(answer[$0.upperBound...]) } ?? ""
    return (status, bodyStart)
}

/// Runs a blocking read on a thread of its own (never on the cooperative pool).
func blockingRead<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        Thread { continuation.resume(returning: body()) }.start()
    }
}

/// The worker out of file descriptors, for real: run under a low `prlimit`, it refuses the
/// connections it has no descriptors for (counted), never aborts, and serves again once
/// they close.
@Suite struct IngressDescriptorTests {
    @Test func outOfDescriptorsTheWorkerRefusesConnectionsAndLives() async throws {
        let setup = try await IngressSetup(ackMode: .immediate)
        defer { setup.stop() }
        let ingressPort = try freePort(), metricsPort = try freePort()
        let ingress = setup.configuration.ingressSettings
        let spool = setup.folder + "/spool"
        let (worker, errors) = try WorkerProcess.start(setup.ccs, databaseURL: setup.database.url, spool: spool, [
            "--connections", "1", "--ingress-address", "127.0.0.1:\(ingressPort)", "--ingress-plain",
            "--ingress-project-id", ingress.projectID!, "--ingress-id-token-keys-url", ingress.idTokenKeysURL,
            "--ingress-burst", "100000", "--ingress-rate", "100000", "--metrics-address", "127.0.0.1:\(metricsPort)",
        ], descriptorLimit: 160)
        defer { if worker.isRunning { kill(worker.processIdentifier, SIGKILL) } }
        let log = Task { String(decoding: await readToEnd(errors.fileHandleForReading), as: UTF8.self) }
        let token = try setup.idToken(uid: "descriptors")
        try await waitUntil("the ingress answers", within: .seconds(30)) {
            (try? await plainPost(port: ingressPort, #"{"message_id":"d-0","token":"t","data":{}}"#, token: token, timeout: 2))?.status == 200
        }
        // Far more connections than 160 descriptors hold, kept open.
        var held: [Int32] = []
        for _ in 0..<150 {
            if let fd = connectedLoopbackSocket(port: ingressPort, receiveTimeout: 1) { held.append(fd) }
        }
        // Out of descriptors the metrics endpoint cannot accept either: the refusals show as
        // connections the worker closed at once (it accepts them with a descriptor kept in
        // reserve for that, and closes them).
        try await waitUntil("connections closed for want of descriptors", within: .seconds(20)) {
            held.contains { fd in
                var byte: UInt8 = 0
                return recv(fd, &byte, 1, Int32(MSG_DONTWAIT)) == 0
            }
        }
        let alive = worker.isRunning
        held.forEach { close($0) }
        if !alive {
            Issue.record("the worker stopped: \(await log.value.suffix(2000))")
            return
        }
        try await waitUntil("the refusals counted", within: .seconds(20)) {
            let page = (try? await httpGet(port: metricsPort, path: "/metrics", timeout: 2))?.body ?? ""
            return page.contains(#"fcm_worker_ingress_connections_refused_total{reason="descriptors"}"#)
        }
        // Served again once they closed.
        try await waitUntil("the ingress answers again", within: .seconds(30)) {
            (try? await plainPost(port: ingressPort, #"{"message_id":"d-1","token":"t","data":{}}"#, token: token, timeout: 2))?.status == 200
        }
        kill(worker.processIdentifier, SIGTERM)
        _ = await exitStatus(of: worker)
        let text = await log.value
        #expect(text.contains("file descriptor limit is 160"), "\(text.suffix(2000))")
        #expect(text.contains("refused a connection: out of file descriptors"), "\(text.suffix(2000))")
    }
}
