import FCM
import Foundation
import Outbox
import Simulator
import Testing
import Transport
import Worker

/// Rows with transport `v1` sent by the worker to the simulated FCM HTTP v1 API over HTTP/2,
/// with a real OAuth2 grant (a service-account key made at test time, an RS256 JWT the
/// simulator checks): every answer of FCM's v1 error table, the fan-out of
/// `registration_ids`, token refresh, quotas, and no duplicates across a GOAWAY.
@Suite struct V1TransportTests {
    struct Setup {
        let ccs: TestCCS
        let v1: FCMV1Simulator
        let database: TestDatabase
        let configuration: WorkerConfiguration
        let accountFile: String

        func stop() {
            ccs.simulator.stop()
            v1.stop()
        }
    }

    func setUp(_ configure: (inout FCMV1Simulator.Settings) -> Void = { _ in }) async throws -> Setup {
        let ccs = try TestCCS()
        var settings = FCMV1Simulator.Settings()
        configure(&settings)
        let v1 = try FCMV1Simulator(identity: try ccs.authority.issueServerIdentity(dnsNames: ["localhost"], ipAddresses: ["127.0.0.1"]),
                                    settings: settings)
        let database = try await TestDatabase.make()
        var configuration = try ccs.downstreamWorker(database: database)
        let accountFile = FileManager.default.temporaryDirectory.appendingPathComponent("account-\(UUID()).json").path
        try v1.account.keyFileJSON.write(toFile: accountFile, atomically: true, encoding: .utf8)
        configuration.serviceAccountFile = accountFile
        configuration.v1Endpoint = "127.0.0.1:\(v1.port)"
        configuration.downstream.retry.base = .milliseconds(50)
        // A project quota pauses from a second here, not Google's minute.
        configuration.downstream.v1QuotaPause = .seconds(1)
        return Setup(ccs: ccs, v1: v1, database: database, configuration: configuration, accountFile: accountFile)
    }

    func insert(_ database: TestDatabase, target: String, payload: String = #"{"data":{"k":"v"}}"#) async throws -> Int64 {
        try await database.query("INSERT INTO downstream_messages (target, transport, payload) VALUES ($1, 'v1', $2::jsonb) RETURNING id",
                                 [.text(target), .text(payload)])[0].int(0)!
    }

    @Test func rowsReachTheSimulatorOverHTTP2WithOneGrantAndTheirNamesAreWrittenBack() async throws {
        let setup = try await setUp()
        defer { setup.stop() }
        let (task, _) = startWorker(setup.configuration)
        defer { task.cancel() }
        var ids: [Int64] = []
        for index in 0..<40 { ids.append(try await insert(setup.database, target: "device-\(index)", payload: #"{"data":{"n":"\#(index)"}}"#)) }
        let topic = try await insert(setup.database, target: "/topics/news",
                                     payload: #"{"data":{"count":3,"flag":true},"notification":{"title":"Hi"},"priority":"high","time_to_live":60,"collapse_key":"c"}"#)
        try await setup.database.waitForOutbox("status = 'acked'", count: 41)
        let deliveries = setup.v1.deliveries
        #expect(deliveries.count == 41)
        #expect(deliveries.allSatisfy { $0.protocolName == "h2" })
        #expect(setup.v1.counters.tokensIssued == 1, "one access token serves every request")
        for id in ids {
            let row = try await setup.database.outboxRow(id)
            #expect(row["sent_on"] == "v1" && row["attempts"] == "1" && row["error_code"] == nil, "\(row)")
            // One target: FCM's name for the message in its own column, token_results left empty.
            let name = try #require(row["message_name"])
            #expect(name.hasPrefix("projects/") && row["token_results"] == nil, "\(row)")
            #expect(deliveries.contains { $0.name == name })
        }
        // The legacy shape translated: strings for data, the topic without /topics/, Android's and APNs' options.
        let translated = try #require(deliveries.first { $0.message["topic"] == "news" }?.message)
        #expect(translated["data"] == ["count": "3", "flag": "true"])
        #expect(translated["notification"] == ["title": "Hi"])
        #expect(translated["android"]?["priority"] == "HIGH" && translated["android"]?["ttl"] == "60s"
                && translated["android"]?["collapse_key"] == "c")
        #expect(translated["apns"]?["headers"]?["apns-priority"] == "10")
        let topicRow = try await setup.database.outboxRow(topic)
        #expect(topicRow["status"] == "acked")
    }

    @Test func everyAnswerOfFCMsErrorTableSettlesItsRow() async throws {
        let setup = try await setUp()
        defer { setup.stop() }
        let (task, _) = startWorker(setup.configuration)
        defer { task.cancel() }
        let gone = try await insert(setup.database, target: "unregistered-1")
        let other = try await insert(setup.database, target: "mismatch-1")
        let malformed = try await insert(setup.database, target: "invalid-1")
        let apns = try await insert(setup.database, target: "apns-refused-1")
        let apnsOldName = try await insert(setup.database, target: "apns-auth-error-1")
        let receipts = try await insert(setup.database, target: "device-r", payload: #"{"data":{"k":"v"},"delivery_receipt_requested":true}"#)
        try await setup.database.waitForOutbox("status = 'failed'", count: 6)
        func row(_ id: Int64) async throws -> [String: String] { try await setup.database.outboxRow(id) }
        #expect(try await row(gone)["error_code"] == "UNREGISTERED")
        #expect(try await row(other)["error_code"] == "SENDER_ID_MISMATCH")
        let invalid = try await row(malformed)
        #expect(invalid["error_code"] == "INVALID_ARGUMENT" && invalid["error_description"]?.contains("message.token") == true, "\(invalid)")
        #expect(try await row(apns)["error_code"] == "THIRD_PARTY_AUTH_ERROR")
        #expect(try await row(apnsOldName)["error_code"] == "APNS_AUTH_ERROR")
        // Refused before any request, with the field named.
        let untranslatable = try await row(receipts)
        #expect(untranslatable["error_code"] == "INVALID_MESSAGE"
                && untranslatable["error_description"]?.contains("delivery_receipt_requested") == true, "\(untranslatable)")
        #expect(!setup.v1.deliveries.contains { $0.message["token"] == "device-r" })
        await setup.database.waitForRows(in: "device_tokens", count: 2, within: .seconds(10))
        // Only UNREGISTERED and a malformed token drop a token; SENDER_ID_MISMATCH keeps it.
        let marks = try await setup.database.query("SELECT token, state, error_code FROM device_tokens ORDER BY token")
            .map { "\($0.string(0)!) \($0.string(1)!) \($0.string(2) ?? "-")" }
        #expect(marks == ["invalid-1 invalid INVALID_ARGUMENT", "unregistered-1 unregistered UNREGISTERED"])
        #expect(setup.v1.counters.tokensIssued == 1, "no answer here is the access token's")
        // A row to a token FCM refused before fails without a request.
        let requestsBefore = setup.v1.counters.sendRequests
        let again = try await insert(setup.database, target: "unregistered-1")
        try await setup.database.waitForOutbox("status = 'failed' AND id = \(again)", count: 1)
        #expect(setup.v1.counters.sendRequests == requestsBefore)
    }

    @Test func unavailableAndInternalAreRetriedAndAQuotaHoldsTheProjectForItsRetryAfter() async throws {
        let setup = try await setUp()
        defer { setup.stop() }
        setup.v1.scriptNext([.status(503), .status(500)])
        let (task, _) = startWorker(setup.configuration)
        defer { task.cancel() }
        let flaky = try await insert(setup.database, target: "device-flaky")
        try await setup.database.waitForOutbox("status = 'acked'", count: 1)
        let row = try await setup.database.outboxRow(flaky)
        #expect(row["attempts"] == "3" && row["error_code"] == nil, "\(row)")
        // 429 with Retry-After: 2 s: nothing is sent to the project before it passes.
        setup.v1.scriptNext([.status(429, retryAfter: "2")])
        let started = ContinuousClock.now
        let limited = try await insert(setup.database, target: "device-limited")
        try await Task.sleep(for: .milliseconds(300))
        let held = try await insert(setup.database, target: "device-held")
        try await setup.database.waitForOutbox("status = 'acked' AND id IN (\(limited), \(held))", count: 2)
        #expect(ContinuousClock.now - started >= .seconds(2))
        let limitedRow = try await setup.database.outboxRow(limited)
        #expect(limitedRow["attempts"] == "2", "\(limitedRow)")
        // The held row was never refused: it waited, unsent, and went out once.
        let heldRow = try await setup.database.outboxRow(held)
        #expect(heldRow["attempts"] == "1", "\(heldRow)")
    }

    @Test func anExpiredAccessTokenIsReplacedOnceAndTheMessageGoesOut() async throws {
        let setup = try await setUp()
        defer { setup.stop() }
        let (task, _) = startWorker(setup.configuration)
        defer { task.cancel() }
        _ = try await insert(setup.database, target: "device-1")
        try await setup.database.waitForOutbox("status = 'acked'", count: 1)
        setup.v1.expireTokens()
        let second = try await insert(setup.database, target: "device-2")
        try await setup.database.waitForOutbox("status = 'acked'", count: 2)
        #expect(setup.v1.counters.tokensIssued == 2)
        #expect(try await setup.database.outboxRow(second)["attempts"] == "1")
    }

    @Test func aKeyRotatedByReplacingTheFileIsUsedForTheNextTokenWithoutARestart() async throws {
        let setup = try await setUp()
        defer { setup.stop() }
        let (task, _) = startWorker(setup.configuration)
        defer { task.cancel() }
        _ = try await insert(setup.database, target: "device-1")
        try await setup.database.waitForOutbox("status = 'acked'", count: 1)
        // The operator adds a key, replaces the file (a rename, as a deploy tool writes it),
        // and deletes the old key; the tokens issued with it stop working.
        let rotated = try setup.v1.addKey()
        try rotated.keyFileJSON.write(toFile: setup.accountFile + ".new", atomically: true, encoding: .utf8)
        #expect(rename(setup.accountFile + ".new", setup.accountFile) == 0)
        setup.v1.revokeKey(id: setup.v1.account.privateKeyID)
        setup.v1.expireTokens()
        let second = try await insert(setup.database, target: "device-2")
        try await setup.database.waitForOutbox("status = 'acked'", count: 2)
        #expect(setup.v1.grantKeyIDs == [setup.v1.account.privateKeyID, rotated.privateKeyID])
        #expect(try await setup.database.outboxRow(second)["attempts"] == "1")
    }

    @Test func aV1MessageInTheRowIsSentAsItIs() async throws {
        let setup = try await setUp()
        defer { setup.stop() }
        let (task, _) = startWorker(setup.configuration)
        defer { task.cancel() }
        let id = try await insert(setup.database, target: "installation-7", payload: """
            {"message": {"fid": "installation-7", "data": {"k": "v"}, "android": {"ttl": "30s", "priority": "high"},
                         "apns": {"payload": {"aps": {"sound": "default"}}}, "fcm_options": {"analytics_label": "l"}}}
            """)
        let wrong = try await insert(setup.database, target: "device-9", payload: #"{"message": {"token": "someone-else"}}"#)
        try await setup.database.waitForOutbox("status IN ('acked', 'failed')", count: 2)
        #expect(try await setup.database.outboxRow(id)["status"] == "acked")
        let sent = try #require(setup.v1.deliveries.first?.message)
        #expect(sent["fid"] == "installation-7" && sent["token"] == nil && sent["fcm_options"] == ["analytics_label": "l"])
        let refused = try await setup.database.outboxRow(wrong)
        #expect(refused["status"] == "failed" && refused["error_description"]?.contains("message.token") == true, "\(refused)")
        #expect(setup.v1.deliveries.count == 1)
    }

    @Test func registrationIDsFanOutToOneRequestPerTokenEachAnswerKept() async throws {
        let setup = try await setUp()
        defer { setup.stop() }
        let (task, _) = startWorker(setup.configuration)
        defer { task.cancel() }
        let id = try await setup.database.query("""
            INSERT INTO downstream_messages (registration_ids, transport, payload)
            VALUES (ARRAY['phone-1', 'unregistered-2', 'phone-3'], 'v1', '{"data":{"k":"v"}}') RETURNING id
            """)[0].int(0)!
        try await setup.database.waitForOutbox("status = 'acked'", count: 1)
        let row = try await setup.database.outboxRow(id)
        #expect(row["transport"] == "v1")
        let results = try #require(row["token_results"].flatMap { try? JSONValue.parse($0) })
        #expect(results["phone-1"]?["name"] != nil && results["phone-3"]?["name"] != nil)
        #expect(results["unregistered-2"]?["error"] == "UNREGISTERED")
        #expect(Set(setup.v1.deliveries.compactMap { $0.message["token"]?.stringValue }) == ["phone-1", "phone-3"])
        #expect(try await setup.database.count("device_tokens", where: "token = 'unregistered-2' AND state = 'unregistered'") == 1)
    }

    @Test func noRowIsDeliveredTwiceAcrossGoAwaysAndAResetStreamAtMostOnceMore() async throws {
        // A GOAWAY after every 7th request on a connection; one stream reset and one
        // connection dropped after FCM took the message (their answers never read): those
        // rows alone may be delivered once more (the others in flight on the dropped
        // connection too, as FCM took them unanswered).
        let setup = try await setUp { $0.goAwayEvery = 7 }
        defer { setup.stop() }
        setup.v1.scriptNext([.resetAfterDelivering])
        let (task, _) = startWorker(setup.configuration)
        defer { task.cancel() }
        for index in 0..<200 { _ = try await insert(setup.database, target: "device-\(index)", payload: #"{"data":{"n":"\#(index)"}}"#) }
        try await setup.database.waitForOutbox("status = 'acked'", count: 200, within: .seconds(60))
        var perRow: [String: Int] = [:]
        for delivery in setup.v1.deliveries { perRow[delivery.message["data"]?["n"]?.stringValue ?? "?", default: 0] += 1 }
        #expect(perRow.count == 200)
        #expect(setup.v1.counters.connections > 2, "GOAWAYs moved the streams to new connections")
        // Every send FCM took is one the row counts: a row is sent again only after an
        // attempt whose answer never came, never after one whose answer was read.
        var attempts: [String: Int] = [:]
        for row in try await setup.database.query("SELECT payload->'data'->>'n', attempts FROM downstream_messages") {
            attempts[row.string(0)!] = Int(row.int(1)!)
        }
        #expect(attempts == perRow)
        let twice = perRow.filter { $0.value > 1 }
        #expect(!twice.isEmpty && twice.values.allSatisfy { $0 == 2 } && twice.count <= 101, "\(twice)")
    }

    @Test func aWorkerKilledMidFlightLeavesEveryRowSentAtMostOnceMore() async throws {
        // FCM answers after 100 ms: at the kill, hundreds of requests are under way, and
        // answers read whose write-back had not committed. The next worker sends those rows
        // again (FCM took them; their answers are lost with the first worker): once more at
        // most, and every row ends acked once. (With answers after 30 ms, a worker sent all
        // 3,000 in the moment between the 600th delivery and the kill, once, in CI.)
        let setup = try await setUp { $0.latency = .milliseconds(100) }
        defer { setup.stop() }
        _ = try await setup.database.query("""
            INSERT INTO downstream_messages (target, transport, payload)
            SELECT 'device-' || g, 'v1', jsonb_build_object('data', jsonb_build_object('n', g::text)) FROM generate_series(1, 3000) AS g
            """)
        let spool = FileManager.default.temporaryDirectory.appendingPathComponent("spool-\(UUID())").path
        let flags = ["--service-account-file", setup.accountFile, "--v1-endpoint", "127.0.0.1:\(setup.v1.port)"]
        let (first, _) = try WorkerProcess.start(setup.ccs, databaseURL: setup.database.url, spool: spool, flags)
        let deadline = ContinuousClock.now + .seconds(30)
        while setup.v1.counters.delivered < 600 && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        kill(first.processIdentifier, SIGKILL)
        try await WorkerProcess.waitForExit(first)
        let deliveredBeforeKill = setup.v1.counters.delivered
        #expect(deliveredBeforeKill >= 600 && deliveredBeforeKill < 3000, "\(deliveredBeforeKill)")
        // The first worker's claims lapse after the lease: a short one for the second worker's sweep.
        _ = try await setup.database.query("UPDATE outbox_claims SET expires_at = now()")
        let (second, _) = try WorkerProcess.start(setup.ccs, databaseURL: setup.database.url, spool: spool, flags)
        defer { second.terminate() }
        try await setup.database.waitForOutbox("status = 'acked'", count: 3000, within: .seconds(60))
        var perRow: [String: Int] = [:]
        for delivery in setup.v1.deliveries { perRow[delivery.message["data"]?["n"]?.stringValue ?? "?", default: 0] += 1 }
        #expect(perRow.count == 3000)
        #expect(perRow.values.allSatisfy { $0 <= 2 }, "a row was sent more than once more")
        let twice = perRow.values.count { $0 == 2 }
        // At most what the first worker had under way or answered but unwritten.
        #expect(twice <= deliveredBeforeKill, "\(twice) of \(deliveredBeforeKill)")
        #expect(try await setup.database.count("downstream_messages", where: "status = 'acked' AND sent_on = 'v1'") == 3000)
    }

    @Test func anUnusableServiceAccountOrARefusedGrantStopsTheStart() async throws {
        let setup = try await setUp()
        defer { setup.stop() }
        var broken = setup.configuration
        let brokenFile = FileManager.default.temporaryDirectory.appendingPathComponent("broken-\(UUID()).json").path
        try #"{"type": "service_account", "project_id": "p", "client_email": "a@b", "private_key": "not a key"}"#
            .write(toFile: brokenFile, atomically: true, encoding: .utf8)
        broken.serviceAccountFile = brokenFile
        let (first, _) = startWorker(broken)
        await #expect(throws: ServiceAccountRefused.self) { try await first.value }
        setup.v1.revokeKey()
        let (second, _) = startWorker(setup.configuration)
        do {
            try await second.value
            Issue.record("a refused grant started the worker")
        } catch let error as ServiceAccountRefused {
            #expect(error.description.contains("invalid_grant"), "\(error)")
            #expect(!error.description.contains("PRIVATE KEY"))
        }
        #expect(setup.v1.counters.grantsRefused == 1)
    }
}
