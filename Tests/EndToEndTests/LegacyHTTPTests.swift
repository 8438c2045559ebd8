import FCM
import Foundation
import Simulator
import Synchronization
import Testing
import Worker
import XMPP

/// FCM's legacy HTTP endpoints simulated over HTTPS, with a client that trusts them.
private struct TestHTTP {
    let simulator: FCMHTTPSimulator
    let client: FCMHTTPClient

    init(tokenAnswer: @escaping @Sendable (String) -> FCMHTTPSimulator.TokenAnswer = { _ in .success() },
         serverKey: String = TestCCS.serverKey, timeout: Duration = .seconds(10)) throws {
        let authority = try CertificateAuthority()
        simulator = try FCMHTTPSimulator(senderID: TestCCS.senderID, serverKey: TestCCS.serverKey,
                                         identity: try authority.issueServerIdentity(), tokenAnswer: tokenAnswer)
        var settings = FCMHTTPClient.Settings(serverKey: serverKey, senderID: TestCCS.senderID)
        try settings.setEndpoint("127.0.0.1:\(simulator.port)")
        settings.trust = .caPEM(authority.rootCertificatePEM)
        settings.retryBase = .milliseconds(100)
        settings.requestTimeout = timeout
        client = try FCMHTTPClient(settings: settings)
    }
}

@Suite struct LegacyHTTPEndToEndTests {
    @Test func aMulticastOf2500TokensIsSplitAndEveryTokenAccountedFor() async throws {
        let http = try TestHTTP(tokenAnswer: { token in
            if token.hasSuffix("7") { return .error("NotRegistered") }
            if token.hasSuffix("5") { return .success(canonicalRegistrationID: "canonical-\(token)") }
            return .success()
        })
        defer { http.simulator.stop() }
        let tokens = (0..<2500).map { "token-\($0)" }
        var message = LegacyHTTPMessage(target: .registrationIDs([]), data: ["k": .string("v")])
        message.options.timeToLive = 0
        let outcome = await http.client.sendMulticast(message, to: tokens)
        #expect(outcome.failure == nil && outcome.unsent.isEmpty)
        let results = outcome.results.map(\.result)
        #expect(outcome.results.map(\.token) == tokens)
        #expect(results.count == 2500)
        let requests = http.simulator.requests
        #expect(requests.map { (try? JSONValue.parse($0.body))?["registration_ids"].map { value -> Int in
            if case .array(let items) = value { items.count } else { 0 }
        } ?? 0 } == [1000, 1000, 500])
        #expect(requests.allSatisfy { $0.headers["authorization"] == "key=\(TestCCS.serverKey)" })
        #expect(requests.allSatisfy { (try? JSONValue.parse($0.body))?["time_to_live"] == .number(0) })
        for (token, result) in zip(tokens, results) {
            if token.hasSuffix("7") {
                #expect(result.error == "NotRegistered" && result.action == NackAction.failAndMarkToken(.unregistered))
            } else {
                #expect(result.messageID != nil && result.error == nil)
                #expect(result.canonicalRegistrationID == (token.hasSuffix("5") ? "canonical-\(token)" : nil))
            }
        }
    }

    @Test func aRefusedKeyStopsAtOnceAndIsAConfigurationError() async throws {
        let http = try TestHTTP(serverKey: "wrong-key")
        defer { http.simulator.stop() }
        do {
            _ = try await http.client.send(LegacyHTTPMessage(target: .to("token")))
            Issue.record("a refused key was accepted")
        } catch {
            #expect(error == .refused(.unauthorized) && error.isConfigurationError)
            #expect(!error.description.contains("wrong-key"))
        }
        #expect(http.simulator.requests.count == 1)
    }

    @Test func aBadRequestIsReportedWithItsReasonAndNotRetried() async throws {
        let http = try TestHTTP()
        defer { http.simulator.stop() }
        http.simulator.scriptNext([.status(400)])
        do {
            _ = try await http.client.send(LegacyHTTPMessage(target: .to("token")))
            Issue.record("a 400 was accepted")
        } catch {
            #expect(error == .refused(.badRequest("")))
        }
        #expect(http.simulator.requests.count == 1)
    }

    @Test func unavailableIsRetriedAfterRetryAfterAndWithBackoff() async throws {
        let http = try TestHTTP()
        defer { http.simulator.stop() }
        http.simulator.scriptNext([.status(503, retryAfter: "1"), .status(500)])
        let started = ContinuousClock.now
        let response = try await http.client.send(LegacyHTTPMessage(target: .to("token")))
        #expect(ContinuousClock.now - started >= .seconds(1), "Retry-After: 1 was not honoured")
        guard case .tokens(_, 1, 0, 0, let results) = response else {
            Issue.record("\(response)")
            return
        }
        #expect(results.first?.messageID != nil)
        #expect(http.simulator.requests.count == 3)
    }

    @Test func aTimeoutIsRetriedAndRetriesRunOut() async throws {
        let http = try TestHTTP(timeout: .milliseconds(500))
        defer { http.simulator.stop() }
        http.simulator.scriptNext([.noAnswer])
        let response = try await http.client.send(LegacyHTTPMessage(target: .to("token")))
        guard case .tokens(_, 1, _, _, _) = response else {
            Issue.record("\(response)")
            return
        }
        http.simulator.scriptNext(Array(repeating: .status(500), count: 5))
        do {
            _ = try await http.client.send(LegacyHTTPMessage(target: .to("token")))
            Issue.record("five 500s were not reported")
        } catch {
            #expect(error == .refused(.unavailable(status: 500, retryAfter: nil)))
        }
    }

    @Test func thePlainTextFormAndTopicsAreAnswered() async throws {
        let http = try TestHTTP(tokenAnswer: { $0 == "old" ? .success(canonicalRegistrationID: "new") : .error("InvalidRegistration") })
        defer { http.simulator.stop() }
        var message = LegacyHTTPMessage(target: .to("old"), data: ["text": .string("hi there")])
        message.options.collapseKey = "c"
        let plain = try await http.client.send(message, plainText: true)
        guard case .plainText(let result) = plain else {
            Issue.record("\(plain)")
            return
        }
        #expect(result.messageID != nil && result.canonicalRegistrationID == "new")
        #expect(http.simulator.requests.last?.body == "registration_id=old&collapse_key=c&data.text=hi+there")
        #expect(http.simulator.requests.last?.headers["content-type"]?.hasPrefix("application/x-www-form-urlencoded") == true)
        message.target = .to("bad")
        #expect(try await http.client.send(message, plainText: true) == .plainText(.init(error: "InvalidRegistration")))
        guard case .topic(let id?, nil) = try await http.client.send(LegacyHTTPMessage(target: .to("/topics/news"))) else {
            Issue.record("the topic answer")
            return
        }
        #expect(id > 0)
    }

    @Test func invalidRequestsAreRefusedBeforeSending() async throws {
        let http = try TestHTTP()
        defer { http.simulator.stop() }
        let invalid = [LegacyHTTPMessage(target: .registrationIDs((0...1000).map { "t\($0)" })),
                       LegacyHTTPMessage(target: .to("t"), data: ["google.x": .string("v")]),
                       LegacyHTTPMessage(target: .condition("'a' in topics &&"))]
        for message in invalid {
            do {
                _ = try await http.client.send(message)
                Issue.record("sent \(message.target)")
            } catch {
                guard case .invalid = error else { Issue.record("\(error)"); continue }
            }
        }
        #expect(http.simulator.requests.isEmpty)
    }

    @Test func aDeviceGroupLivesUntilItsLastTokenIsRemoved() async throws {
        let http = try TestHTTP()
        defer { http.simulator.stop() }
        let key = try await http.client.deviceGroup(.create(name: "family", tokens: ["a", "b"]))
        #expect(http.simulator.requests.last?.headers["project_id"] == TestCCS.senderID)
        #expect(try await http.client.deviceGroup(.add(name: "family", key: key, tokens: ["c"])) == key)
        #expect(http.simulator.groups["family"]?.tokens == ["a", "b", "c"])
        do {
            _ = try await http.client.deviceGroup(.create(name: "family", tokens: ["d"]))
            Issue.record("a second group with the same name was created")
        } catch {
            #expect(error == .refused(.badRequest("notification_key already exists")))
        }
        #expect(try await http.client.deviceGroup(.remove(name: "family", key: key, tokens: ["a", "b"])) == key)
        #expect(http.simulator.groups["family"]?.tokens == ["c"])
        _ = try await http.client.deviceGroup(.remove(name: "family", key: key, tokens: ["c"]))
        #expect(http.simulator.groups["family"] == nil)
        // Sending to the group's key goes to `to`.
        guard case .tokens(_, 1, _, _, _) = try await http.client.send(LegacyHTTPMessage(target: .to(key))) else {
            Issue.record("sending to a notification key")
            return
        }
    }
}

@Suite struct HTTPOutboxTests {
    /// A worker with both simulators, trusting the same CA.
    private func start(tokenAnswer: @escaping @Sendable (String) -> FCMHTTPSimulator.TokenAnswer = { _ in .success() })
        async throws -> (TestCCS, FCMHTTPSimulator, TestDatabase, Task<Void, any Error>) {
        let ccs = try TestCCS(log: DownstreamLog())
        let http = try FCMHTTPSimulator(senderID: TestCCS.senderID, serverKey: TestCCS.serverKey,
                                        identity: try ccs.authority.issueServerIdentity(), tokenAnswer: tokenAnswer)
        let database = try await TestDatabase.make()
        var configuration = try ccs.downstreamWorker(database: database)
        configuration.httpEndpoint = "127.0.0.1:\(http.port)"
        let (task, _) = startWorker(configuration)
        try await ccs.simulator.waitForBoundSessions(1)
        return (ccs, http, database, task)
    }

    @Test func aRowWithManyTokensGoesOutAsAMulticastAndRecordsEveryToken() async throws {
        let (ccs, http, database, task) = try await start(tokenAnswer: { token in
            if token.hasSuffix("7") { return .error("NotRegistered") }
            if token == "token-5" { return .success(canonicalRegistrationID: "token-5-new") }
            return .success()
        })
        defer { task.cancel(); ccs.simulator.stop(); http.stop() }
        let tokens = (0..<2500).map { "token-\($0)" }
        let id = try await database.query("""
            INSERT INTO downstream_messages (registration_ids, payload) VALUES ($1::text[], '{"data":{"k":"v"}}') RETURNING id
            """, [.array(tokens.map { .text($0) })])[0].int(0)!
        try await database.waitForOutbox("status = 'acked'", count: 1)
        let row = try await database.outboxRow(id)
        #expect(row["transport"] == "http" && row["sent_on"] == "http" && row["attempts"] == "1")
        let results = try #require(row["token_results"].flatMap { try? JSONValue.parse($0) }?.objectValue)
        #expect(results.count == 2500)
        #expect(results["token-7"] == .object(["error": .string("NotRegistered")]))
        #expect(results["token-5"]?["registration_id"] == .string("token-5-new"))
        #expect(results["token-1"]?["message_id"] != nil)
        #expect(http.requests.count == 3)
        #expect(try await database.count("device_tokens", where: "state = 'unregistered'") == 250)
        #expect(try await database.count("device_tokens", where: "state = 'replaced' AND canonical_token = 'token-5-new'") == 1)
        // Never sent by both transports.
        #expect(ccs.simulator.counters.downstreamReceived == 0)
    }

    @Test func rowsMarkedForHTTPGoOverHTTPAndUnavailableTokensAreRetriedAlone() async throws {
        let flaky = Atomic<Int>(0)
        let (ccs, http, database, task) = try await start(tokenAnswer: { token in
            if token == "flaky", flaky.add(1, ordering: .relaxed).newValue == 1 { return .error("Unavailable") }
            return .success()
        })
        defer { task.cancel(); ccs.simulator.stop(); http.stop() }
        let single = try await database.query("""
            INSERT INTO downstream_messages (target, transport, payload) VALUES ('token-h', 'http', '{"data":{"k":"v"}}') RETURNING id
            """)[0].int(0)!
        let multicast = try await database.query("""
            INSERT INTO downstream_messages (registration_ids, payload) VALUES ('{steady,flaky}', '{"data":{"k":"v"}}') RETURNING id
            """)[0].int(0)!
        try await database.waitForOutbox("status = 'acked'", count: 2, within: .seconds(20))
        #expect(try await database.outboxRow(single)["sent_on"] == "http")
        let row = try await database.outboxRow(multicast)
        #expect(row["attempts"] == "2")
        // Acked in the end: no error of its first attempt is left on it (it kept Unavailable).
        #expect(row["error_code"] == nil && row["error_description"] == nil, "\(row)")
        // The retry went to the flaky token only.
        let bodies = http.requests.map(\.body).filter { $0.contains("flaky") }
        #expect(bodies.count == 2)
        #expect(bodies.last.map { !$0.contains("steady") } == true)
        #expect(ccs.simulator.counters.downstreamReceived == 0)
    }
}

@Suite struct DeviceGroupTests {
    @Test func theLifecycleKeepsTheTableInStepWithFCM() async throws {
        let http = try TestHTTP()
        defer { http.simulator.stop() }
        let database = try await TestDatabase.make()
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        let groups = DeviceGroups(client: http.client, database: connection)
        let created = try await groups.create("family", tokens: ["a", "b"])
        #expect(try await groups.add("family", tokens: ["c", "a"]).tokens == ["a", "b", "c"])
        #expect(try await groups.show() == [DeviceGroups.Group(name: "family", notificationKey: created.notificationKey,
                                                                tokens: ["a", "b", "c"])])
        #expect(try await groups.remove("family", tokens: ["a"])?.tokens == ["b", "c"])
        #expect(try await groups.remove("family", tokens: ["b", "c"]) == nil)
        #expect(try await groups.show().isEmpty)
        #expect(http.simulator.groups.isEmpty)
        await #expect(throws: DeviceGroups.GroupError.self) { _ = try await groups.add("nobody", tokens: ["x"]) }
    }

    @Test func theCommandLineCreatesAGroupAndRefusesAnAddWithoutTokens() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let http = try FCMHTTPSimulator(senderID: TestCCS.senderID, serverKey: TestCCS.serverKey,
                                        identity: try ccs.authority.issueServerIdentity())
        defer { http.stop() }
        let database = try await TestDatabase.make()
        let configuration = try ccs.worker(database: database)
        let environment = ["FCM_SENDER_ID": TestCCS.senderID, "FCM_SERVER_KEY": TestCCS.serverKey,
                           "FCM_HTTP_ENDPOINT": "127.0.0.1:\(http.port)", "FCM_CA_FILE": configuration.caFile!,
                           "DATABASE_URL": database.url]
        let created = try await CommandLineTests.run(["groups", "create", "team", "t1", "t2"], environment: environment)
        #expect(created.status == 0, "\(created.standardError)")
        let key = try #require(http.groups["team"]?.key)
        #expect(try await database.query("SELECT notification_key FROM device_groups WHERE name = 'team'").first?.string(0) == key)
        let missing = try await CommandLineTests.run(["groups", "add", "team"], environment: environment)
        #expect(missing.status == 2 && missing.standardError.contains("at least one token"))
    }
}
