import Runtime
import FCM
import Foundation
import Simulator
import Synchronization
import Testing
import Worker

/// FCM's legacy HTTP API as FCM answered it, and what the worker makes of its faults:
/// device groups, multicasts failing part-way, requests whose outcome is unknown,
/// `Retry-After` across a shutdown, and claims kept while a request is under way.
@Suite struct HTTPFaultTests {
    struct Setup {
        let ccs: TestCCS
        let http: FCMHTTPSimulator
        let database: TestDatabase
        let client: FCMHTTPClient
        let configuration: WorkerConfiguration

        func stop() {
            ccs.simulator.stop()
            http.stop()
        }
    }

    func setUp(tokenAnswer: @escaping @Sendable (String) -> FCMHTTPSimulator.TokenAnswer = { _ in .success() },
                       configure: (inout WorkerConfiguration) -> Void = { _ in }) async throws -> Setup {
        let ccs = try TestCCS(log: DownstreamLog())
        let http = try FCMHTTPSimulator(senderID: TestCCS.senderID, serverKey: TestCCS.serverKey,
                                        identity: try ccs.authority.issueServerIdentity(), tokenAnswer: tokenAnswer)
        let database = try await TestDatabase.make()
        var configuration = try ccs.downstreamWorker(database: database)
        configuration.httpEndpoint = "127.0.0.1:\(http.port)"
        configure(&configuration)
        var settings = configuration.httpClient
        settings.retryBase = .milliseconds(50)
        return Setup(ccs: ccs, http: http, database: database, client: try FCMHTTPClient(settings: settings), configuration: configuration)
    }

    func insert(_ database: TestDatabase, target: String) async throws -> Int64 {
        try await database.query("""
            INSERT INTO downstream_messages (target, transport, payload) VALUES ($1, 'http', '{"data":{"k":"v"}}') RETURNING id
            """, [.text(target)])[0].int(0)!
    }

    @Test func aSendToADeviceGroupIsAnsweredWithCountsAndTheRowIsAcked() async throws {
        let setup = try await setUp()
        defer { setup.stop() }
        let key = try await setup.client.deviceGroup(.create(name: "family", tokens: ["phone", "tablet"]))
        // As FCM answered it: counts, no per-token results.
        let answer = try await setup.client.send(LegacyHTTPMessage(target: .to(key), data: ["k": .string("v")]))
        #expect(answer == .group(success: 2, failure: 0, failedRegistrationIDs: []))
        let (task, _) = startWorker(setup.configuration)
        defer { task.cancel() }
        let id = try await insert(setup.database, target: key)
        try await setup.database.waitForOutbox("status = 'acked'", count: 1)
        let row = try await setup.database.outboxRow(id)
        #expect(row["status"] == "acked" && row["error_code"] == nil, "\(row)")
        let results = try #require(row["token_results"].flatMap { try? JSONValue.parse($0) }?.objectValue)
        #expect(results[key]?["message_id"] == .string("group:2/2"))
    }

    @Test func aGroupMemberFCMCouldNotReachIsRetriedAloneAndNobodyGetsItTwice() async throws {
        let attempts = BlockingLock<[String: Int]>([:])
        let setup = try await setUp(tokenAnswer: { token in
            let attempt = attempts.withLock { $0[token, default: 0] += 1; return $0[token]! }
            return token == "tablet" && attempt == 1 ? .error("Unavailable") : .success()
        }, configure: { $0.downstream.retry.base = .milliseconds(100) })
        defer { setup.stop() }
        let key = try await setup.client.deviceGroup(.create(name: "family", tokens: ["phone", "tablet", "watch"]))
        let (task, _) = startWorker(setup.configuration)
        defer { task.cancel() }
        let id = try await insert(setup.database, target: key)
        try await setup.database.waitForOutbox("status = 'acked'", count: 1, within: .seconds(20))
        let row = try await setup.database.outboxRow(id)
        #expect(row["attempts"] == "2")
        let sends = setup.http.requests.filter { $0.path == "/fcm/send" }.compactMap { try? JSONValue.parse($0.body) }
        #expect(sends.count == 2)
        #expect(sends.first?["to"] == .string(key))
        #expect(sends.last?["registration_ids"] == .array([.string("tablet")]), "the retry went to the member that missed it only")
        #expect(attempts.withLock { $0 } == ["phone": 1, "tablet": 2, "watch": 1])
    }

    @Test func aMulticastFailingPartWayResendsOnlyWhatFailed() async throws {
        let received = BlockingLock<[String: Int]>([:])
        let setup = try await setUp(tokenAnswer: { token in
            received.withLock { $0[token, default: 0] += 1 }
            return .success()
        }, configure: { $0.downstream.retry.base = .milliseconds(100) })
        defer { setup.stop() }
        let tokens = (0..<1500).map { "token-\($0)" }
        // The client keeps the answered request's results when a later one fails.
        setup.http.scriptNext([.delay(.zero), .status(503)])
        let outcome = await setup.client.sendMulticast(LegacyHTTPMessage(target: .registrationIDs([])), to: tokens, retrying: false)
        #expect(outcome.results.count == 1000 && outcome.unsent == Array(tokens[1000...]))
        #expect(outcome.failure == .refused(.unavailable(status: 503, retryAfter: nil)))
        received.withLock { $0.removeAll() }
        // The outbox sends the failed request's tokens again, and only those.
        setup.http.scriptNext([.delay(.zero), .status(503)])
        let (task, _) = startWorker(setup.configuration)
        defer { task.cancel() }
        let id = try await setup.database.query("""
            INSERT INTO downstream_messages (registration_ids, payload) VALUES ($1::text[], '{"data":{"k":"v"}}') RETURNING id
            """, [.array(tokens.map { .text($0) })])[0].int(0)!
        try await setup.database.waitForOutbox("status = 'acked'", count: 1, within: .seconds(20))
        #expect(try await setup.database.outboxRow(id)["attempts"] == "2")
        let counts = received.withLock { $0 }
        #expect(counts.count == 1500 && counts.values.allSatisfy { $0 == 1 }, "every token got the message once")
    }

    @Test func aRequestWhoseConnectionBrokeAfterItWasSentIsNotSentAgainAndIsCounted() async throws {
        let setup = try await setUp()
        defer { setup.stop() }
        setup.http.scriptNext([.closeAfterReading])
        do {
            _ = try await setup.client.send(LegacyHTTPMessage(target: .to("token")))
            Issue.record("an unknown outcome was taken for an answer")
        } catch {
            guard case .transport(let transport) = error, transport.isOutcomeUnknown else {
                Issue.record("\(error)")
                return
            }
        }
        #expect(setup.http.requests.count == 1, "sent again although FCM may have taken it")
        #expect(setup.client.outcomeUnknownCount == 1)
        // A kept-alive connection the server closed while idle is replaced before writing:
        // that request provably never reached it, so it goes out on a new connection.
        // The test waits for the server's close: a request written before it arrives would
        // meet the real race of keep-alive (closed after the request was sent: unknown).
        setup.http.scriptNext([.answerThenClose])
        _ = try await setup.client.send(LegacyHTTPMessage(target: .to("token")))
        let deadline = ContinuousClock.now + .seconds(10)
        while setup.http.connectionsClosedAfterAnswer < 1 && ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(2))
        }
        #expect(setup.http.connectionsClosedAfterAnswer == 1)
        _ = try await setup.client.send(LegacyHTTPMessage(target: .to("token")))
        #expect(setup.http.requests.count == 3)
        #expect(setup.client.outcomeUnknownCount == 1)
    }
}

/// The timing-sensitive HTTP faults, run on their own after the suite (`scripts/test`).
@Suite struct HTTPTimingTests {
    private let faults = HTTPFaultTests()
    private func setUp(tokenAnswer: @escaping @Sendable (String) -> FCMHTTPSimulator.TokenAnswer = { _ in .success() },
                       configure: (inout WorkerConfiguration) -> Void = { _ in }) async throws -> HTTPFaultTests.Setup {
        try await faults.setUp(tokenAnswer: tokenAnswer, configure: configure)
    }
    private func insert(_ database: TestDatabase, target: String) async throws -> Int64 {
        try await faults.insert(database, target: target)
    }

    @Test func retryAfterHoldsTheRowAcrossAShutdownAndARestart() async throws {
        let setup = try await setUp()
        defer { setup.stop() }
        setup.http.scriptNext([.status(503, retryAfter: "4")])
        let (first, _) = startWorker(setup.configuration)
        let id = try await insert(setup.database, target: "token-r")
        try await setup.database.waitForOutbox("status = 'retry'", count: 1)
        let row = try await setup.database.query("SELECT extract(epoch FROM available_at - now())::float8 FROM downstream_messages WHERE id = $1", [.int(id)])
        #expect((row.first?.double(0) ?? 0) > 3, "the row waits for Retry-After")
        // A shutdown now, and a new worker at once: neither sends it before its time.
        first.cancel()
        _ = await first.result
        let (second, _) = startWorker(setup.configuration)
        defer { second.cancel() }
        try await Task.sleep(for: .seconds(2))
        #expect(setup.http.requests.count == 1, "sent again before Retry-After")
        try await setup.database.waitForOutbox("status = 'acked'", count: 1, within: .seconds(15))
        #expect(setup.http.requests.count == 2)
    }

    @Test func theClaimOnARowUnderWayIsRenewedSoNoOtherWorkerSendsIt() async throws {
        let setup = try await setUp(configure: { $0.downstream.lease = .seconds(1) })
        defer { setup.stop() }
        // FCM takes 3 s (three leases) to answer.
        setup.http.scriptNext([.delay(.seconds(3))])
        let (first, _) = startWorker(setup.configuration)
        defer { first.cancel() }
        _ = try await insert(setup.database, target: "token-slow")
        try await Task.sleep(for: .milliseconds(500))
        let (second, _) = startWorker(setup.configuration)
        defer { second.cancel() }
        try await setup.database.waitForOutbox("status = 'acked'", count: 1, within: .seconds(15))
        #expect(setup.http.requests.count == 1, "the row was taken over while its request was under way")
    }
}
