import FCM
import Foundation
import Handlers
import Outbox
import Runtime
import Simulator
import Testing
import Worker
import TestSupport

/// FCM's HTTP v1 rules that bite in production (spec FCM-V1.md, docs/protocol.md's v1
/// section), each against the simulator answering as Google does: Apple's priority rule,
/// sender mismatches, quotas of the project and of a device, the token endpoint's transient
/// errors, `APNS_AUTH_ERROR`, v1's data keys, time to live from queueing, the client
/// headers, and rows the worker cannot send.
extension V1TransportTests {
    /// The number of rows matching `condition` once it stops moving (the write-back of
    /// answers already read lands within a moment).
    func settledCount(_ database: TestDatabase, _ condition: String) async throws -> Int {
        var last = try await database.count("downstream_messages", where: condition)
        for _ in 0..<20 {
            try await Task.sleep(for: .milliseconds(300))
            let now = try await database.count("downstream_messages", where: condition)
            if now == last { return now }
            last = now
        }
        return last
    }

    @Test func aHighPriorityDataMessageReachesAnAppleTokenAndPriorityTenIsKeptForAlerts() async throws {
        let setup = try await setUp()
        defer { setup.stop() }
        let (task, _) = startWorker(setup.configuration)
        defer { task.cancel() }
        let data = try await insert(setup.database, target: "ios-data", payload: #"{"data":{"k":"v"},"priority":"high"}"#)
        let background = try await insert(setup.database, target: "ios-background",
                                          payload: #"{"data":{"k":"v"},"priority":"high","content_available":true}"#)
        let alert = try await insert(setup.database, target: "ios-alert", payload: #"{"notification":{"title":"Hi"},"priority":"high"}"#)
        // A v1 message as is that asks for 10 on a background push: refused as FCM refuses it.
        let wrong = try await insert(setup.database, target: "ios-wrong",
                                     payload: #"{"message":{"data":{"k":"v"},"apns":{"headers":{"apns-priority":"10"}}}}"#)
        try await setup.database.waitForOutbox("status IN ('acked', 'failed')", count: 4)
        for id in [data, background, alert] {
            let row = try await setup.database.outboxRow(id)
            #expect(row["status"] == "acked", "\(row)")
        }
        let refused = try await setup.database.outboxRow(wrong)
        #expect(refused["status"] == "failed" && refused["error_code"] == "INVALID_ARGUMENT"
                && refused["error_description"]?.contains("apns-priority") == true, "\(refused)")
        let sent = Dictionary(uniqueKeysWithValues: setup.v1.deliveries.map { ($0.message["token"]?.stringValue ?? "", $0.message) })
        #expect(sent["ios-data"]?["android"]?["priority"] == "HIGH" && sent["ios-data"]?["apns"] == nil)
        #expect(sent["ios-background"]?["apns"]?["headers"] == ["apns-priority": "5", "apns-push-type": "background"])
        #expect(sent["ios-alert"]?["apns"]?["headers"]?["apns-priority"] == "10")
    }

    @Test func aSenderMismatchFailsTheRowAndKeepsTheToken() async throws {
        let setup = try await setUp()
        defer { setup.stop() }
        let (task, _) = startWorker(setup.configuration)
        defer { task.cancel() }
        let first = try await insert(setup.database, target: "mismatch-1")
        try await setup.database.waitForOutbox("status = 'failed' AND id = \(first)", count: 1)
        #expect(try await setup.database.outboxRow(first)["error_code"] == "SENDER_ID_MISMATCH")
        #expect(try await setup.database.count("device_tokens") == 0, "the token is not marked")
        // The next row to it is sent (a request), not failed from a mark.
        let requests = setup.v1.counters.sendRequests
        let again = try await insert(setup.database, target: "mismatch-1")
        try await setup.database.waitForOutbox("status = 'failed' AND id = \(again)", count: 1)
        #expect(setup.v1.counters.sendRequests == requests + 1)
    }

    @Test func mostTokensRefusedForAnotherSenderStopV1SendingUntilTheCredentialsChange() async throws {
        // Every token belongs to another project, until the "fix".
        let wrongProject = BlockingLock(true)
        let setup = try await setUp { settings in
            settings.targetAnswer = { target in wrongProject.withLock { $0 } ? .senderMismatch : FCMV1Simulator.answerByName(target) }
            settings.latency = .milliseconds(20)
        }
        defer { setup.stop() }
        var configuration = setup.configuration
        configuration.v1Connections = 1
        let (worker, task, lines) = launchLoggedWorker(configuration)
        defer { task.cancel() }
        for index in 0..<40 { _ = try await insert(setup.database, target: "device-\(index)") }
        try await waitUntil("sending stops", within: .seconds(20)) { worker.metricsPage.contains("fcm_worker_v1_sending_stopped 1") }
        let said = lines.withLock { $0 }.filter { $0.contains("SENDER_ID_MISMATCH for") }
        #expect(said.count == 1 && said[0].contains("--project-id") && said[0].contains("SIGHUP"), "\(said)")
        #expect(worker.metricsPage.contains("fcm_worker_v1_sender_mismatch_stops_total 1"))
        // The rows answered up to the one that fired the rule (the tenth distinct token)
        // failed; the rest wait, with their tokens kept (those in flight then go back, unfailed).
        try await setup.database.waitForOutbox("status = 'failed'", count: 9)
        let failed = try await settledCount(setup.database, "status = 'failed'")
        #expect(failed >= 9 && failed < 40, "\(failed)")
        #expect(try await setup.database.count("device_tokens") == 0)
        let requests = setup.v1.counters.sendRequests
        try await Task.sleep(for: .milliseconds(1500))
        #expect(setup.v1.counters.sendRequests == requests, "nothing is sent while stopped")
        // The operator replaces the key file with one for the right project: sending resumes.
        wrongProject.withLock { $0 = false }
        let rotated = try setup.v1.addKey()
        try rotated.keyFileJSON.write(toFile: setup.accountFile + ".new", atomically: true, encoding: .utf8)
        #expect(rename(setup.accountFile + ".new", setup.accountFile) == 0)
        try await setup.database.waitForOutbox("status = 'acked'", count: 40 - failed, within: .seconds(20))
        #expect(worker.metricsPage.contains("fcm_worker_v1_sending_stopped 0"))
        // Stopped again, SIGHUP (reloadCredentials) resumes it without a new file.
        wrongProject.withLock { $0 = true }
        for index in 40..<80 { _ = try await insert(setup.database, target: "device-\(index)") }
        try await waitUntil("sending stops again", within: .seconds(20)) { worker.metricsPage.contains("fcm_worker_v1_sending_stopped 1") }
        let failedAgain = try await settledCount(setup.database, "status = 'failed'") - failed
        wrongProject.withLock { $0 = false }
        worker.reloadCredentials()
        try await setup.database.waitForOutbox("status = 'acked'", count: 80 - failed - failedAgain, within: .seconds(20))
        #expect(worker.metricsPage.contains("fcm_worker_v1_sender_mismatch_stops_total 2"))
    }

    @Test func aProjectQuotaPausesThenSendingResumesPacedNotAllAtOnce() async throws {
        // Ten messages a second for the project, answered in the front end's shape
        // (ErrorInfo, no FCM code) without Retry-After.
        let setup = try await setUp { settings in
            settings.quotaPerMinute = 10
            settings.quotaWindow = .seconds(1)
            settings.quotaRetryAfter = false
            settings.quotaShape = .errorInfo
        }
        defer { setup.stop() }
        var configuration = setup.configuration
        configuration.downstream.v1QuotaPause = .seconds(1)
        configuration.downstream.v1QuotaWindow = .seconds(1)
        let (_, task, lines) = launchLoggedWorker(configuration)
        defer { task.cancel() }
        _ = try await setup.database.query("""
            INSERT INTO downstream_messages (target, transport, payload)
            SELECT 'device-' || g, 'v1', '{"data":{"k":"v"}}' FROM generate_series(1, 60) AS g
            """)
        try await setup.database.waitForOutbox("status = 'acked'", count: 60, within: .seconds(60))
        // The first burst is refused beyond the quota (up to 50); after it, sending goes at
        // about the rate FCM accepted. Released all at once after each pause, the same rows
        // drew about 150 refusals (50 + 40 + 30 + 20 + 10).
        let refusals = setup.v1.counters.quotaRefusals
        #expect(refusals <= 80, "\(refusals) quota refusals for 60 messages")
        #expect(lines.withLock { $0 }.contains { $0.contains("quota for project") && $0.contains("resumes paced") })
    }

    @Test func aDevicesQuotaHoldsOnlyThatDevicesRows() async throws {
        // One message per 20 s to a device; the project has no quota.
        let setup = try await setUp { settings in
            settings.deviceQuota = 1
            settings.quotaWindow = .seconds(20)
        }
        defer { setup.stop() }
        let (_, task, lines) = launchLoggedWorker(setup.configuration)
        defer { task.cancel() }
        let busy = try await insert(setup.database, target: "busy-phone")
        try await setup.database.waitForOutbox("status = 'acked' AND id = \(busy)", count: 1)
        let limited = try await insert(setup.database, target: "busy-phone")
        try await waitUntil("the device's rate is refused", within: .seconds(10)) { setup.v1.counters.quotaRefusals >= 1 }
        // Other devices' rows go out at once (a project pause would hold them for the 20 s).
        for index in 0..<10 { _ = try await insert(setup.database, target: "device-\(index)") }
        try await setup.database.waitForOutbox("status = 'acked'", count: 11, within: .seconds(8))
        let row = try await setup.database.outboxRow(limited)
        #expect(row["status"] == "retry" && row["error_code"] == "QUOTA_EXCEEDED", "\(row)")
        #expect(!lines.withLock { $0 }.contains { $0.contains("quota for project") })
    }

    @Test func theTokenEndpointsTransientErrorsAreRetriedAndCountNoSendAttempt() async throws {
        let setup = try await setUp()
        defer { setup.stop() }
        // Six transient answers: the start's fetch takes three, the first send's three more.
        setup.v1.scriptTokenEndpoint([.status(400, error: "temporarily_unavailable"), .status(503), .status(408),
                                      .status(429), .status(400, error: "internal_failure"), .status(500)])
        let id = try await insert(setup.database, target: "device-1")
        let (_, task, lines) = launchLoggedWorker(setup.configuration)
        defer { task.cancel() }
        try await setup.database.waitForOutbox("status = 'acked'", count: 1, within: .seconds(40))
        let row = try await setup.database.outboxRow(id)
        #expect(row["attempts"] == "1", "a send that never left counts no attempt: \(row)")
        #expect(setup.v1.counters.tokenFailures == 6 && setup.v1.counters.grantsRefused == 0)
        #expect(!lines.withLock { $0 }.contains { $0.contains("refused the service account's grant") })
    }

    @Test func apnsAuthErrorFailsTheRowAndKeepsTheAccessToken() async throws {
        let setup = try await setUp()
        defer { setup.stop() }
        let (task, _) = startWorker(setup.configuration)
        defer { task.cancel() }
        let id = try await insert(setup.database, target: "apns-auth-error-1")
        try await setup.database.waitForOutbox("status = 'failed'", count: 1, within: .seconds(10))
        let row = try await setup.database.outboxRow(id)
        #expect(row["error_code"] == "APNS_AUTH_ERROR" && row["attempts"] == "1", "\(row)")
        #expect(setup.v1.counters.tokensIssued == 1, "no new grant for it")
        #expect(setup.v1.counters.sendRequests == 1)
    }

    @Test func aTranslatedRowKeepsV1sDataKeysItsTimeToLiveAndTheClientHeaders() async throws {
        let setup = try await setUp()
        defer { setup.stop() }
        let (task, _) = startWorker(setup.configuration)
        defer { task.cancel() }
        // Option names of the legacy API are ordinary data keys for v1.
        let keys = try await insert(setup.database, target: "device-keys", payload: #"{"data":{"priority":"p","collapse_key":"c","to":"t"}}"#)
        // Queued 200 s ago with 600 s to live: 400 s are left when it goes.
        let old = try await setup.database.query("""
            INSERT INTO downstream_messages (target, transport, payload, created_at)
            VALUES ('device-old', 'v1', '{"data":{"k":"v"},"time_to_live":600}', now() - interval '200 seconds') RETURNING id
            """)[0].int(0)!
        try await setup.database.waitForOutbox("status = 'acked'", count: 2)
        #expect(try await setup.database.outboxRow(keys)["status"] == "acked")
        #expect(try await setup.database.outboxRow(old)["status"] == "acked")
        let sent = try #require(setup.v1.deliveries.first { $0.message["token"] == "device-old" })
        let ttl = try #require(sent.message["android"]?["ttl"]?.stringValue.flatMap { Int($0.dropLast()) })
        #expect((395...400).contains(ttl), "\(ttl)")
        #expect(sent.headers["x-goog-api-format-version"] == "2")
        #expect(sent.headers["x-firebase-client"]?.hasPrefix("fcm-worker/") == true && sent.headers["user-agent"]?.hasPrefix("fcm-worker/") == true)
    }

    @Test func v1RowsAWorkerCannotSendAreSaidAndShownAndTheShutdownSummaryCountsV1() async throws {
        let setup = try await setUp()
        defer { setup.stop() }
        var configuration = setup.configuration
        configuration.serviceAccountFile = nil
        _ = try await insert(setup.database, target: "device-1")
        _ = try await insert(setup.database, target: "device-2")
        let (worker, task, lines) = launchLoggedWorker(configuration)
        try await waitUntil("the waiting rows are said", within: .seconds(20)) {
            lines.withLock { $0 }.contains { $0.contains("2 outbox row(s) with transport v1 wait") && $0.contains("no service account") }
        }
        #expect(worker.metricsPage.contains(#"fcm_worker_outbox_unsendable_rows{transport="v1"} 2"#))
        #expect(worker.metricsPage.contains(#"fcm_worker_outbox_unsendable_rows{transport="xmpp"} 0"#))
        worker.requestShutdown()
        try await task.value
        // `status` with the same settings says so too; with a service account it does not.
        let status = try await MaintenanceCommandTests.fcmWorker(["status", "--database-url", setup.database.url])
        #expect(status.output.contains("UNSENDABLE: 2 v1 row(s) wait"), "\(status)")
        let json = try await MaintenanceCommandTests.fcmWorker(["status", "--json", "--database-url", setup.database.url])
        #expect(try JSONValue.parse(json.output)["unsendable"] == ["v1": 2], "\(json)")
        let able = try await MaintenanceCommandTests.fcmWorker(["status", "--database-url", setup.database.url,
                                                                "--service-account-file", setup.accountFile])
        #expect(able.status == 0 && !able.output.contains("UNSENDABLE"), "\(able)")
        // A worker that has one sends them, and says so at its shutdown.
        let (sender, senderTask, senderLines) = launchLoggedWorker(setup.configuration)
        try await setup.database.waitForOutbox("status = 'acked'", count: 2)
        sender.requestShutdown()
        try await senderTask.value
        #expect(senderLines.withLock { $0 }.contains { $0.contains("outbox over v1: acked 2") }, "\(senderLines.withLock { $0 })")
    }

    @Test func tokensAnEarlierReleaseMarkedForASenderMismatchAreRestoredByTheMigration() async throws {
        let database = try await TestDatabase.make()
        _ = try await database.query("""
            INSERT INTO device_tokens (token, state, error_code) VALUES
                ('other-project', 'unregistered', 'SENDER_ID_MISMATCH'), ('gone', 'unregistered', 'UNREGISTERED')
            """)
        let migration = try #require(MigrationSet.worker.migrations.first { $0.name == "0015_sender_mismatch_keeps_tokens" })
        _ = try await database.query(migration.sql)
        let left = try await database.query("SELECT token FROM device_tokens ORDER BY token").map { $0.string(0)! }
        #expect(left == ["gone"])
    }

    /// Rows that cannot go (credentials for another project: FCM's 403 without a code) are
    /// seen whatever their due time: their code is counted, v1 says it cannot send, and the
    /// age of the oldest unanswered row grows while the due age stays near zero (it once
    /// fell to 0.1 s, hiding the backlog from the alert).
    @Test func aBacklogThatCannotGoIsSeenByItsAgeItsCodeAndTheTransportsState() async throws {
        let setup = try await setUp()
        defer { setup.stop() }
        var configuration = setup.configuration
        configuration.projectID = "another-project"
        configuration.metricsAddress = "127.0.0.1:0"
        let (worker, task, _) = launchLoggedWorker(configuration)
        defer { task.cancel() }
        let id = try await insert(setup.database, target: "device-1")
        try await setup.database.waitForOutbox("status = 'retry' AND error_code = 'PERMISSION_DENIED' AND id = \(id)", count: 1)
        func gauge(_ name: String) -> Double? {
            worker.metricsPage.split(separator: "\n").first { $0.hasPrefix(name + " ") }.flatMap { Double($0.split(separator: " ").last ?? "") }
        }
        #expect(worker.metricsPage.contains(#"fcm_worker_downstream_errors_total{transport="v1",code="PERMISSION_DENIED"} 1"#))
        #expect(gauge(#"fcm_worker_transport_can_send{transport="v1"}"#) == 0)
        #expect(gauge(#"fcm_worker_transport_can_send{transport="http"}"#) == 1)
        // The backlog is read every 10 s: the row held back for the credentials shows its age.
        try await waitUntil("the oldest row's age is read", within: .seconds(25)) {
            (gauge(#"fcm_worker_outbox_oldest_age_seconds{transport="v1"}"#) ?? 0) >= 5
        }
        #expect((gauge(#"fcm_worker_outbox_oldest_due_age_seconds{transport="v1"}"#) ?? 99) < 1, "not due: held for the credentials")
    }

    /// A graceful shutdown stops sending first, then waits for the answers to what is under
    /// way, then hands back only what never went out: with FCM answering in 500 ms on ten
    /// streams a connection, the next worker sends no row twice (it once kept sending what
    /// it had claimed for the whole wait, then handed back the 20 under way, which the next
    /// worker sent again).
    @Test func aGracefulShutdownWithASlowFCMSendsNoRowTwice() async throws {
        let setup = try await setUp { settings in
            settings.latency = .milliseconds(500)
            settings.maximumConcurrentStreams = 10
        }
        defer { setup.stop() }
        _ = try await setup.database.query("""
            INSERT INTO downstream_messages (target, transport, payload)
            SELECT 'device-' || g, 'v1', jsonb_build_object('data', jsonb_build_object('n', g::text)) FROM generate_series(1, 300) AS g
            """)
        let (first, firstTask, _) = launchLoggedWorker(setup.configuration)
        try await waitUntil("the first worker has sent some", within: .seconds(20)) { setup.v1.counters.delivered >= 40 }
        first.requestShutdown()
        try await firstTask.value
        let deliveredByFirst = setup.v1.counters.delivered
        #expect(deliveredByFirst < 300, "the first worker was stopped mid-way (\(deliveredByFirst))")
        let (second, secondTask, _) = launchLoggedWorker(setup.configuration)
        try await setup.database.waitForOutbox("status = 'acked'", count: 300, within: .seconds(60))
        second.requestShutdown()
        try await secondTask.value
        var perRow: [String: Int] = [:]
        for delivery in setup.v1.deliveries { perRow[delivery.message["data"]?["n"]?.stringValue ?? "?", default: 0] += 1 }
        #expect(perRow.count == 300)
        let twice = perRow.filter { $0.value > 1 }
        #expect(twice.isEmpty, "\(twice.count) row(s) sent twice")
        #expect(try await setup.database.count("downstream_messages", where: "attempts = 1") == 300)
    }
}
