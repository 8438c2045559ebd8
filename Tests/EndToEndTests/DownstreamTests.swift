import Runtime
import FCM
import Foundation
import Handlers
import Postgres
import Simulator
import Synchronization
import Testing
import Worker
import XMPP
import TestSupport

/// Every downstream message the simulator received, with how it was answered.
final class DownstreamLog: Sendable {
    struct Entry: Sendable {
        let session: Int
        let messageID: String
        let json: JSONValue
        let at: ContinuousClock.Instant
    }

    private let entries = BlockingLock<[Entry]>([])
    private let answer: @Sendable (DownstreamRequest, _ attempt: Int) -> DownstreamResponse

    /// `answer` decides from the request and which attempt of that message id it is (1…).
    init(answer: @escaping @Sendable (DownstreamRequest, _ attempt: Int) -> DownstreamResponse = { _, _ in .ack() }) {
        self.answer = answer
    }

    var all: [Entry] { entries.withLock { $0 } }

    func responder(_ request: DownstreamRequest) -> DownstreamResponse {
        let attempt = entries.withLock { entries in
            entries.append(Entry(session: request.session, messageID: request.messageID, json: request.json, at: .now))
            return entries.count { $0.messageID == request.messageID }
        }
        return answer(request, attempt)
    }

    func attempts(of messageID: String) -> [Entry] { all.filter { $0.messageID == messageID } }
}

extension TestCCS {
    /// A simulator whose downstream answers come from `log`.
    init(log: DownstreamLog, configure: (inout SimulatorConfiguration) -> Void = { _ in }) throws {
        try self.init(configure: { configuration in
            configuration.responder = { log.responder($0) }
            configure(&configuration)
        })
    }
}

extension TestDatabase {
    /// Inserts outbox rows (target, payload JSON) in one statement; returns their ids.
    @discardableResult
    func insertOutbox(_ rows: [(target: String, payload: String)]) async throws -> [Int64] {
        let result = try await query("""
            INSERT INTO downstream_messages (target, payload)
            SELECT * FROM unnest($1::text[], $2::jsonb[]) RETURNING id
            """, [.array(rows.map { .text($0.target) }), .array(rows.map { .jsonb($0.payload) })])
        return result.compactMap { $0.int(0) }
    }

    /// Waits until `condition` holds for `count` outbox rows (or `limit` passes).
    func waitForOutbox(_ condition: String, count: Int, within limit: Duration = .seconds(20)) async throws {
        do {
            return try await waitUntil("\(count) outbox rows where \(condition)", within: limit, every: .milliseconds(20)) {
                try await self.count("downstream_messages", where: condition) >= count
            }
        } catch is TimedOut {}
        let states = try await query("SELECT status, count(*) FROM downstream_messages GROUP BY 1 ORDER BY 1")
            .map { "\($0.string(0)!)=\($0.string(1)!)" }
        // The claims, to tell a row nobody holds from one a claim still names.
        let claims = try await query("SELECT id, worker, transport, row_ids::text, expires_at > now() FROM outbox_claims ORDER BY id")
            .map { "claim \($0.string(0)!) of \($0.string(1)!) (\($0.string(2)!), live \($0.string(4)!)): \($0.string(3)!)" }
        Issue.record("timed out waiting for \(count) outbox rows where \(condition); rows by status: \(states); claims: \(claims)")
    }

    /// The outbox row `id` as column name → text value.
    func outboxRow(_ id: Int64) async throws -> [String: String] {
        guard let row = try await query("SELECT * FROM downstream_messages WHERE id = $1", [.int(id)]).first else { return [:] }
        var fields: [String: String] = [:]
        for (index, column) in row.columns.enumerated() { fields[column] = row.values[index] }
        return fields
    }
}

extension TestCCS {
    /// Worker settings for the downstream tests: quick reconnects, a short sweep.
    func downstreamWorker(database: TestDatabase, connections: Int = 1) throws -> WorkerConfiguration {
        var configuration = try worker(database: database)
        configuration.connections = connections
        configuration.reconnectBase = .milliseconds(50)
        configuration.reconnectCap = .milliseconds(200)
        return configuration
    }
}

@Suite struct DownstreamTests {
    @Test func theWindowFillsToAHundredAndNeverBeyondWhileUpstreamAcksKeepFlowing() async throws {
        // Phase 1: nothing is answered, so the window fills and stays full.
        let answering = Atomic<Bool>(false)
        let log = DownstreamLog { _, _ in answering.load(ordering: .relaxed) ? .ack(delay: .milliseconds(5)) : .noAnswer }
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (task, _) = startWorker(try ccs.downstreamWorker(database: database))
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        try await database.insertOutbox((0..<300).map { ("token-\($0)", #"{"data":{"n":"x"}}"#) })
        try await ccs.simulator.wait(for: "100 downstream messages") {
            $0.count { if case .downstreamReceived = $0 { true } else { false } } >= 100
        }
        // Upstream acks are not downstream messages: they go out while the window is full.
        for index in 0..<50 { ccs.simulator.injectUpstream(from: "device-\(index)", messageID: "up-\(index)") }
        try await ccs.simulator.wait(for: "50 upstream acks") { $0.acked.count >= 50 }
        // Those acks went out on the same connection after the window filled, with 200 rows
        // claimable all along: a worker that would send a 101st had sent it by now.
        #expect(ccs.simulator.counters.downstreamReceived == 100)

        // Phase 2: answers free the slots; every row goes out, never more than 100 at once.
        answering.store(true, ordering: .relaxed)
        // The 100 pending ones were never answered; they are answered only when resent,
        // which happens when the connection is lost. Drop it.
        ccs.simulator.drop(session: ccs.simulator.boundSessions[0])
        try await database.waitForOutbox("status = 'acked'", count: 300)
        #expect(ccs.simulator.counters.peakPendingDownstream == 100)
        #expect(ccs.simulator.violations.isEmpty)
        // The 100 that were pending on the dropped connection were sent twice.
        #expect(try await database.count("downstream_messages", where: "attempts = 2") == 100)
    }

    /// Answers free their slots on the connection's thread: while the task that reads the
    /// connection waits for room in the upstream pipeline (a handler holds its lane), the
    /// acks of downstream messages still make room for the next ones.
    @Test func answersFreeTheirSlotsWhileTheReadingTaskWaitsForTheUpstreamPipeline() async throws {
        let log = DownstreamLog { _, _ in .ack(delay: .milliseconds(5)) }
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.downstreamWorker(database: database)
        configuration.pipeline.partitions = 1
        configuration.pipeline.queueCapacity = 1
        configuration.pipeline.batchSize = 1
        let gate = GateHandler()
        var handlers = UpstreamHandlers()
        handlers.register("gate", gate)
        let (task, _) = startWorker(configuration, handlers: handlers)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        // The handler holds the first, the lane's queue the second, and the reading task
        // waits to hand over the rest: it pushed the first as it went into the lane.
        for index in 0..<5 { ccs.simulator.injectUpstream(from: "device-\(index)", messageID: "held-\(index)") }
        try await ccs.simulator.wait(for: "5 upstream acks") { $0.acked.count >= 5 }
        try await waitUntil("the handler holds the first message") { gate.entered.load(ordering: .relaxed) == 1 }
        try await database.insertOutbox((0..<300).map { ("token-\($0)", #"{"data":{"n":"x"}}"#) })
        try await ccs.simulator.wait(for: "300 downstream messages answered", timeout: .seconds(20)) {
            $0.count { if case .downstreamAnswered = $0 { true } else { false } } >= 300
        }
        #expect(gate.entered.load(ordering: .relaxed) == 1, "the handler still holds the first message")
        gate.open.store(true, ordering: .relaxed)
        try await database.waitForOutbox("status = 'acked'", count: 300)
        #expect(ccs.simulator.counters.peakPendingDownstream <= 100)
        #expect(ccs.simulator.violations.isEmpty)
    }

    @Test func everyNackCodeLeadsToItsAction() async throws {
        let codes = ["INVALID_JSON", "BAD_REGISTRATION", "DEVICE_UNREGISTERED", "SENDER_ID_MISMATCH", "BAD_ACK",
                     "SERVICE_UNAVAILABLE", "INTERNAL_SERVER_ERROR", "DEVICE_MESSAGE_RATE_EXCEEDED",
                     "TOPICS_MESSAGE_RATE_EXCEEDED", "CONNECTION_DRAINING", "INVALID_APNS_CREDENTIAL",
                     "AUTHENTICATION_FAILED", "SOMETHING_NEW"]
        let log = DownstreamLog { request, attempt in
            let target = request.to ?? ""
            if target == "old-token" { return .ack(canonicalRegistrationID: "new-token") }
            if target.hasPrefix("stanza-") { return .stanzaError(condition: "bad-request", text: "InvalidJson: \(target)") }
            guard let code = codes.first(where: { target.hasSuffix($0) }), attempt == 1 else { return .ack() }
            return .nack(error: code, description: "scripted \(code)")
        }
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.downstreamWorker(database: database, connections: 2)
        configuration.downstream.retry.base = .seconds(60)
        let (task, _) = startWorker(configuration)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(2)
        let targets = codes.map { $0.hasPrefix("TOPICS") ? "/topics/t-\($0)" : "t-\($0)" } + ["old-token", "stanza-x"]
        let ids = try await database.insertOutbox(targets.map { ($0, #"{"data":{"k":"v"}}"#) })
        let byTarget = Dictionary(uniqueKeysWithValues: zip(targets, ids))
        try await database.waitForOutbox("status NOT IN ('pending', 'sending', 'sent')", count: targets.count)

        func row(_ target: String) async throws -> [String: String] { try await database.outboxRow(byTarget[target]!) }
        for code in ["INVALID_JSON", "SENDER_ID_MISMATCH", "INVALID_APNS_CREDENTIAL", "AUTHENTICATION_FAILED",
                     "BAD_REGISTRATION", "DEVICE_UNREGISTERED"] {
            let fields = try await row("t-\(code)")
            #expect(fields["status"] == "failed", "\(code)")
            #expect(fields["error_code"] == code)
            #expect(fields["error_description"] == "scripted \(code)")
        }
        for code in ["SERVICE_UNAVAILABLE", "INTERNAL_SERVER_ERROR", "BAD_ACK", "SOMETHING_NEW",
                     "DEVICE_MESSAGE_RATE_EXCEEDED", "TOPICS_MESSAGE_RATE_EXCEEDED"] {
            let id = byTarget[code.hasPrefix("TOPICS") ? "/topics/t-\(code)" : "t-\(code)"]!
            let fields = try await database.outboxRow(id)
            #expect(fields["status"] == "retry", "\(code)")
            #expect(fields["error_code"] == code)
            #expect(fields["attempts"] == "1")
            // First retry: 60 s × [0.5, 1.5) after the nack, which follows the send at once
            // (measured from the send, not from now: a busy test process reads it late).
            let wait = try #require(try await database.query(
                "SELECT extract(epoch FROM available_at - sent_at)::float8 FROM downstream_messages WHERE id = $1", [.int(id)]
            ).first?.double(0))
            #expect(wait > 29 && wait < 95, "\(code) retries \(wait) s after it was sent")
        }
        // CONNECTION_DRAINING as a nack: sent again at once on the other connection and acked.
        let drained = try await row("t-CONNECTION_DRAINING")
        #expect(drained["status"] == "acked")
        let attempts = log.attempts(of: "ds-\(byTarget["t-CONNECTION_DRAINING"]!)")
        #expect(attempts.count == 2 && attempts[0].session != attempts[1].session)
        // A canonical registration id replaces the token.
        #expect(try await row("old-token")["canonical_token"] == "new-token")
        // A stanza error maps back to its message by the stanza id.
        let refused = try await row("stanza-x")
        #expect(refused["status"] == "failed")
        #expect(refused["error_code"] == "STANZA_ERROR:bad-request")
        #expect(refused["error_description"] == "InvalidJson: stanza-x")

        let tokens = try await database.query("SELECT token, state, canonical_token FROM device_tokens ORDER BY token")
            .map { [$0.string(0)!, $0.string(1)!, $0.string(2) ?? "-"] }
        #expect(tokens == [["old-token", "replaced", "new-token"], ["t-BAD_REGISTRATION", "invalid", "-"],
                           ["t-DEVICE_UNREGISTERED", "unregistered", "-"]])

        // Later messages: refused tokens fail fast without reaching FCM; the replaced token's
        // messages go to its canonical token.
        let received = ccs.simulator.counters.downstreamReceived
        let later = try await database.insertOutbox([("t-BAD_REGISTRATION", #"{"data":{"k":"v"}}"#),
                                                     ("t-DEVICE_UNREGISTERED", #"{"data":{"k":"v"}}"#),
                                                     ("old-token", #"{"data":{"k":"later"}}"#)])
        try await database.waitForOutbox("id >= \(later[0]) AND status IN ('failed', 'acked')", count: 3)
        #expect(try await database.outboxRow(later[0])["error_code"] == "BAD_REGISTRATION")
        #expect(try await database.outboxRow(later[1])["error_code"] == "DEVICE_UNREGISTERED")
        #expect(try await database.outboxRow(later[2])["status"] == "acked")
        #expect(ccs.simulator.counters.downstreamReceived == received + 1)
        #expect(log.attempts(of: "ds-\(later[2])").first?.json["to"] == .string("new-token"))
        #expect(ccs.simulator.violations.isEmpty)
    }

    @Test func messagesPendingOnADroppedConnectionAreSentAgainOnTheNextOne() async throws {
        let log = DownstreamLog { request, _ in request.session == 1 ? .noAnswer : .ack() }
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (task, _) = startWorker(try ccs.downstreamWorker(database: database))
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        let ids = try await database.insertOutbox((0..<50).map { ("token-\($0)", #"{"data":{"k":"v"}}"#) })
        try await ccs.simulator.wait(for: "50 on session 1") {
            $0.count { if case .downstreamReceived(1, _) = $0 { true } else { false } } >= 50
        }
        // Claimed and in flight: named by a claim (migration 0007; the rows are written with their answer).
        #expect(try await database.count("downstream_messages_in_flight") == 50)
        ccs.simulator.drop(session: 1)
        try await database.waitForOutbox("status = 'acked'", count: 50)
        for id in ids {
            let attempts = log.attempts(of: "ds-\(id)")
            #expect(attempts.map(\.session).first == 1 && attempts.count == 2 && attempts[1].session != 1)
        }
        #expect(try await database.count("downstream_messages", where: "sent_on = 'ccs#1.2' AND attempts = 2") == 50)
        #expect(ccs.simulator.violations.isEmpty)
    }

    /// A CCS connection that stopped carrying bytes (a stalled proxy: nothing it writes
    /// arrives, no answer comes back) does not hold a shutdown: the link's send loop, a
    /// child of the transport's task, ends with it, and what was in flight goes back to the
    /// outbox.
    @Test func aStalledConnectionDoesNotHoldTheShutdownAndItsRowsGoBack() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let proxy = try FaultProxy(targetPort: ccs.simulator.port)
        defer { proxy.stop() }
        var configuration = try ccs.downstreamWorker(database: database)
        configuration.port = proxy.port
        configuration.shutdownTimeout = .seconds(1)
        let (worker, task, _) = launchWorker(configuration)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        // The simulator sees the bind before the worker reads its result: one row sent and
        // answered first shows the worker's side of the session is up before the stall
        // (stalled earlier, the worker never finishes binding and claims nothing).
        try await database.insertOutbox([("token-first", #"{"data":{"k":"v"}}"#)])
        try await database.waitForOutbox("status = 'acked'", count: 1)
        proxy.set(.stall(newConnectionsWork: false))
        // 4 KB each, FCM's largest.
        let data = String(repeating: "x", count: 3_900)
        try await database.insertOutbox((0..<400).map { ("token-\($0)", #"{"data":{"k":"\#(data)"}}"#) })
        try await waitUntil("100 rows in flight", within: .seconds(20), every: .milliseconds(20)) {
            try await database.count("downstream_messages_in_flight") >= 100
        }
        // In flight: claimed (rows are written with their answer, and none comes).
        #expect(try await database.count("downstream_messages_in_flight") >= 100)
        let stopping = ContinuousClock.now
        worker.requestShutdown()
        try await task.value
        let took = ContinuousClock.now - stopping
        #expect(took < .seconds(15), "the shutdown took \(took)")
        #expect(try await database.count("downstream_messages_in_flight") == 0)
        #expect(try await database.count("downstream_messages", where: "status IN ('pending', 'retry')") == 400)
    }

    @Test func drainingUnderLoadLosesNothingAndAcksStayOnTheirConnection() async throws {
        // 100 per 50 ms: the 3,000 rows take 1.5 s, so sending goes on well past the drain.
        let log = DownstreamLog { _, _ in .ack(delay: .milliseconds(50)) }
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (task, _) = startWorker(try ccs.downstreamWorker(database: database))
        defer { task.cancel() }
        let first = try await ccs.simulator.waitForBoundSessions(1)[0]
        try await database.insertOutbox((0..<3000).map { ("token-\($0 % 200)", #"{"data":{"k":"v"}}"#) })
        try await ccs.simulator.wait(for: "500 downstream") {
            $0.count { if case .downstreamReceived = $0 { true } else { false } } >= 500
        }
        // Upstream messages already addressed to the draining connection must be acked on it.
        for index in 0..<20 { ccs.simulator.injectUpstream(from: "device-\(index)", messageID: "drain-up-\(index)", session: first) }
        ccs.simulator.sendConnectionDraining(session: first, closeAfter: .seconds(1))
        try await database.waitForOutbox("status = 'acked'", count: 3000, within: .seconds(40))
        try await ccs.simulator.wait(for: "the upstream acks") { $0.acked.count >= 20 }

        let events = ccs.simulator.events
        #expect(events.violations.isEmpty, "\(events.violations)")
        // The replacement was bound before CCS closed the draining connection.
        let replacementBound = events.firstIndex { if case .bound(let session, _) = $0 { session != first } else { false } }
        let drainedClosed = events.firstIndex { if case .closed(first, _) = $0 { true } else { false } }
        #expect(replacementBound != nil && drainedClosed != nil && replacementBound! < drainedClosed!)
        #expect(Set(events.acked).isSuperset(of: (0..<20).map { "drain-up-\($0)" }))
        #expect(try await database.count("downstream_messages", where: "status = 'acked'") == 3000)
        #expect(try await database.count("upstream_messages") == 20)
    }

    @Test func receiptsAreAckedAndRecordedOnTheirRow() async throws {
        let ccs = try TestCCS(log: DownstreamLog())
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (task, _) = startWorker(try ccs.downstreamWorker(database: database))
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        let id = try await database.insertOutbox([("token-r", #"{"data":{"k":"v"},"delivery_receipt_requested":true}"#)])[0]
        try await database.waitForOutbox("status = 'delivered'", count: 1)
        let row = try await database.outboxRow(id)
        #expect(row["delivered_at"] != nil && row["acked_at"] != nil)
        try await ccs.simulator.wait(for: "the receipt's ack") { $0.acked.contains("dr2:ds-\(id)") }
        #expect(ccs.simulator.violations.isEmpty)
        // Receipts are not upstream messages from devices: nothing is stored for them.
        #expect(try await database.count("upstream_messages") == 0)
    }

    @Test func twoWorkersOnOneOutboxSendEachRowOnce() async throws {
        let log = DownstreamLog { _, _ in .ack(delay: .milliseconds(2)) }
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (first, _) = startWorker(try ccs.downstreamWorker(database: database, connections: 2))
        defer { first.cancel() }
        let (second, _) = startWorker(try ccs.downstreamWorker(database: database, connections: 2))
        defer { second.cancel() }
        try await ccs.simulator.waitForBoundSessions(4)
        for _ in 0..<5 {
            try await database.insertOutbox((0..<1000).map { ("token-\($0)", #"{"data":{"k":"v"}}"#) })
        }
        // A generous limit: under AddressSanitizer, beside another test, on a slow machine, the
        // 5,000 rows took over 40 s (4,699 acked then, and still going). What this test checks
        // is that each is sent once, not how fast.
        try await database.waitForOutbox("status = 'acked'", count: 5000, within: .seconds(120))
        let sent = log.all.map(\.messageID)
        #expect(sent.count == 5000)
        #expect(Set(sent).count == 5000)
        #expect(try await database.query("SELECT count(DISTINCT claimed_by) FROM downstream_messages").first?.int(0) == 2)
        #expect(ccs.simulator.violations.isEmpty)
    }

    @Test func aCrashedWorkersClaimsAreTakenOverWhenItsLeaseRunsOut() async throws {
        let log = DownstreamLog()
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let ids = try await database.insertOutbox((0..<10).map { ("token-\($0)", #"{"data":{"k":"v"}}"#) })
        // A worker claimed and sent them, then died: its lease runs for another second.
        _ = try await database.query("""
            UPDATE downstream_messages SET status = 'sent', attempts = 1, claimed_by = 'dead-worker',
                available_at = now() + interval '1 second'
            """)
        let started = ContinuousClock.now
        let (task, _) = startWorker(try ccs.downstreamWorker(database: database))
        defer { task.cancel() }
        try await database.waitForOutbox("status = 'acked'", count: 10)
        #expect(ContinuousClock.now - started > .milliseconds(900))
        let first = try #require(log.all.map(\.at).min())
        #expect(first - started > .milliseconds(900), "sent before the lease ran out")
        #expect(try await database.outboxRow(ids[0])["attempts"] == "2")
        #expect(try await database.count("downstream_messages", where: "claimed_by = 'dead-worker'") == 0)
    }

    @Test func invalidAndExpiredRowsNeverReachFCM() async throws {
        let ccs = try TestCCS(log: DownstreamLog())
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (task, _) = startWorker(try ccs.downstreamWorker(database: database))
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        let rows: [(String, String, String)] = [
            ("token-1", #"{"data":{"from":"x"}}"#, "data.from"),
            ("token-2", #"{"notification":{"color":"red"}}"#, "notification.color"),
            ("token-3", #"{"time_to_live":9999999}"#, "time_to_live"),
            ("token-4", #"{"priority":"urgent"}"#, "priority"),
            ("token-5", #"{"data":{"big":"\#(String(repeating: "x", count: 5000))"}}"#, "4096"),
            ("token-6", #"{"frobnicate":true}"#, "payload.frobnicate"),
        ]
        let ids = try await database.insertOutbox(rows.map { ($0.0, $0.1) })
        let condition = try await database.query("""
            INSERT INTO downstream_messages (condition, payload)
            VALUES ($1, '{"data":{"k":"v"}}') RETURNING id
            """, [.text("'a' in topics && 'b' in topics && 'c' in topics && 'd' in topics")])[0].int(0)!
        // Inserted 10 s ago with a 5 s time to live: expired before it could be sent.
        let expired = try await database.query("""
            INSERT INTO downstream_messages (target, payload, created_at)
            VALUES ('token-7', '{"data":{"k":"v"},"time_to_live":5}', now() - interval '10 seconds') RETURNING id
            """)[0].int(0)!
        try await database.waitForOutbox("status IN ('failed', 'expired')", count: rows.count + 2)
        for (id, row) in zip(ids, rows) {
            let fields = try await database.outboxRow(id)
            #expect(fields["status"] == "failed")
            #expect(fields["error_code"] == "INVALID_MESSAGE")
            #expect(fields["error_description"]?.contains(row.2) == true, "\(fields["error_description"] ?? "")")
        }
        #expect(try await database.outboxRow(condition)["error_description"]?.contains("at most 2") == true)
        #expect(try await database.outboxRow(expired)["status"] == "expired")
        #expect(ccs.simulator.counters.downstreamReceived == 0)
    }

    @Test func sendsSpreadOverEveryConnectionAndDrainingKeepsTheirNumber() async throws {
        let log = DownstreamLog { _, _ in .ack(delay: .milliseconds(20)) }
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (task, _) = startWorker(try ccs.downstreamWorker(database: database, connections: 4))
        defer { task.cancel() }
        let sessions = try await ccs.simulator.waitForBoundSessions(4)
        try await database.insertOutbox((0..<2000).map { ("token-\($0)", #"{"data":{"k":"v"}}"#) })
        try await database.waitForOutbox("status = 'acked'", count: 2000)
        let perSession = Dictionary(grouping: log.all, by: \.session).mapValues(\.count)
        #expect(Set(perSession.keys) == Set(sessions), "\(perSession)")
        #expect(perSession.values.allSatisfy { $0 >= 200 }, "\(perSession)")
        #expect(try await database.query("SELECT count(DISTINCT sent_on) FROM downstream_messages").first?.int(0) == 4)

        ccs.simulator.sendConnectionDraining(session: sessions[0], closeAfter: .milliseconds(200))
        try await ccs.simulator.wait(for: "the drained connection to close and four to stay open") { events in
            events.contains { if case .closed(sessions[0], _) = $0 { true } else { false } } && events.openBoundSessions.count == 4
        }
        #expect(ccs.simulator.violations.isEmpty)
    }

    @Test func answersReadWhileTheDatabaseIsDownAreWrittenOnceItIsBack() async throws {
        let log = DownstreamLog { _, _ in .ack(delay: .milliseconds(300)) }
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let (database, name) = try await TestDatabase.makeDedicated()
        let (task, _) = startWorker(try ccs.downstreamWorker(database: database))
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        try await database.insertOutbox((0..<50).map { ("token-\($0)", #"{"data":{"k":"v"}}"#) })
        try await ccs.simulator.wait(for: "50 sent") { $0.count { if case .downstreamReceived = $0 { true } else { false } } >= 50 }
        // The acks arrive while PostgreSQL is unreachable.
        try await TestDatabase.cutOff(name)
        try await ccs.simulator.wait(for: "50 acked") {
            $0.count { if case .downstreamAnswered = $0 { true } else { false } } >= 50
        }
        try await Task.sleep(for: .milliseconds(500))
        try await TestDatabase.restore(name)
        try await database.waitForOutbox("status = 'acked'", count: 50, within: .seconds(30))
        #expect(ccs.simulator.counters.downstreamReceived == 50, "nothing was sent twice")
        #expect(ccs.simulator.violations.isEmpty)
    }

    @Test func onShutdownUnansweredAndUnsentRowsAreHandedBackAndSentByTheNextWorker() async throws {
        let answering = Atomic<Bool>(false)
        let log = DownstreamLog { _, _ in answering.load(ordering: .relaxed) ? .ack() : .noAnswer }
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.downstreamWorker(database: database)
        configuration.shutdownTimeout = .seconds(1)
        let (worker, task, _) = launchWorker(configuration)
        try await ccs.simulator.waitForBoundSessions(1)
        try await database.insertOutbox((0..<150).map { ("token-\($0)", #"{"data":{"k":"v"}}"#) })
        try await ccs.simulator.wait(for: "a full window") {
            $0.count { if case .downstreamReceived = $0 { true } else { false } } >= 100
        }
        worker.requestShutdown()
        try await task.value
        // Nothing is left claimed: the 100 sent are retries, the rest are pending, all due now.
        #expect(try await database.count("downstream_messages", where: "status = 'retry' AND attempts = 1 AND available_at <= now()") == 100)
        #expect(try await database.count("downstream_messages", where: "status = 'pending' AND available_at <= now()") == 50)

        answering.store(true, ordering: .relaxed)
        let (next, _) = startWorker(configuration)
        defer { next.cancel() }
        try await database.waitForOutbox("status = 'acked'", count: 150)
        #expect(try await database.count("downstream_messages", where: "attempts = 2") == 100)
    }

    /// Cancelling `run()` is "stop now", not the graceful shutdown: no answer is waited for
    /// and nothing is handed back; the rows under way stay claimed until their lease runs out
    /// (the test above shows `requestShutdown()` handing the same rows back).
    @Test func cancellingTheWorkerStopsWithoutHandingItsRowsBack() async throws {
        let ccs = try TestCCS(log: DownstreamLog { _, _ in .noAnswer })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.downstreamWorker(database: database)
        configuration.shutdownTimeout = .seconds(30)
        let (task, _) = startWorker(configuration)
        try await ccs.simulator.waitForBoundSessions(1)
        try await database.insertOutbox((0..<150).map { ("token-\($0)", #"{"data":{"k":"v"}}"#) })
        try await ccs.simulator.wait(for: "a full window") {
            $0.count { if case .downstreamReceived = $0 { true } else { false } } >= 100
        }
        task.cancel()
        _ = await task.result
        #expect(try await database.count("downstream_messages_in_flight") >= 100, "the rows under way were handed back")
        #expect(try await database.count("downstream_messages", where: "status = 'retry'") == 0)
    }

    @Test func handlersRepliesAreSentAndEchoRepliesToTheSender() async throws {
        let log = DownstreamLog()
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var handlers = UpstreamHandlers()
        handlers.register("echo", EchoHandler())
        let (task, _) = startWorker(try ccs.downstreamWorker(database: database), handlers: handlers)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        ccs.simulator.injectUpstream(from: "device-echo", data: ["hello": .string("world")], messageID: "echo-1")
        try await database.waitForOutbox("status = 'acked'", count: 1)
        let sent = try #require(log.all.first)
        #expect(sent.json["to"] == .string("device-echo"))
        #expect(sent.json["data"] == .object(["hello": .string("world")]))
        let row = try await database.query("SELECT source_message_id FROM downstream_messages").first
        #expect(row?.string(0) == "echo-1")
    }
}

/// Downstream behaviour with timing bounds. `scripts/test` runs this suite on its own after
/// the others, so that the bounds measure the worker and not a saturated test process.
@Suite struct DownstreamTimingTests {
    @Test func aLongWaitForAnAnswerKeepsTheClaimSoNoOtherWorkerSendsIt() async throws {
        let log = DownstreamLog { _, _ in .ack(delay: .milliseconds(2500)) }
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.downstreamWorker(database: database)
        configuration.downstream.lease = .seconds(1)
        let (first, _) = startWorker(configuration)
        defer { first.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        try await database.insertOutbox((0..<10).map { ("token-\($0)", #"{"data":{"k":"v"}}"#) })
        try await ccs.simulator.wait(for: "10 sent") { $0.count { if case .downstreamReceived = $0 { true } else { false } } >= 10 }
        // A second worker polls the outbox while the answers take 2.5 leases to come.
        let (second, _) = startWorker(configuration)
        defer { second.cancel() }
        try await database.waitForOutbox("status = 'acked'", count: 10, within: .seconds(10))
        #expect(ccs.simulator.counters.downstreamReceived == 10, "a renewed claim was taken over")
    }

    @Test func aRowInsertedWithPlainSQLIsSentWithinASecondWithTimeToLiveZeroOnTheWire() async throws {
        let log = DownstreamLog()
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.downstreamWorker(database: database)
        // NOTIFY, not the sweep, must be what sends it.
        configuration.downstream.sweepInterval = .seconds(30)
        let (task, events) = startWorker(configuration)
        defer { task.cancel() }
        try await events.wait(for: "the connection and LISTEN") { events in
            events.contains { if case .connected = $0 { true } else { false } }
                && events.contains { if case .outboxListening = $0 { true } else { false } }
        }

        let inserted = ContinuousClock.now
        let id = try await database.insertOutbox([("token-a", #"{"data":{"k":"v"},"time_to_live":0,"priority":"high"}"#)])[0]
        try await ccs.simulator.wait(for: "the message", timeout: .seconds(5)) {
            $0.contains { if case .downstreamReceived(_, "ds-\(id)") = $0 { true } else { false } }
        }
        let latency = ContinuousClock.now - inserted
        #expect(latency < .seconds(1), "sent \(latency) after the insert")
        // The simulator records the message before its responder logs it: on a busy machine
        // the log may be a moment behind the event.
        try await waitUntil("the responder logged it") { !log.all.isEmpty }
        let json = try #require(log.all.first?.json)
        #expect(json["time_to_live"] == .number(0))
        #expect(json["to"] == .string("token-a"))
        #expect(json["priority"] == .string("high"))
        #expect(json["data"] == .object(["k": .string("v")]))

        try await database.waitForOutbox("status = 'acked'", count: 1)
        let row = try await database.outboxRow(id)
        #expect(row["status"] == "acked")
        #expect(row["attempts"] == "1")
        #expect(row["sent_on"] == "ccs#1.1")
        #expect(row["sent_at"] != nil && row["acked_at"] != nil)
        #expect(row["available_at"] == nil)
        #expect(ccs.simulator.violations.isEmpty)
    }

    @Test func retriesBackOffExponentiallyWithJitter() async throws {
        let log = DownstreamLog { _, attempt in attempt <= 3 ? .nack(error: "SERVICE_UNAVAILABLE") : .ack() }
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.downstreamWorker(database: database)
        // FCM's 1 s base; a sweep too rare to mask a missed retry wakeup.
        configuration.downstream.sweepInterval = .seconds(20)
        let (task, _) = startWorker(configuration)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        let ids = try await database.insertOutbox((0..<5).map { ("token-\($0)", #"{"data":{"k":"v"}}"#) })
        try await database.waitForOutbox("status = 'acked'", count: 5, within: .seconds(30))
        var firstGaps: [Double] = []
        for id in ids {
            let times = log.attempts(of: "ds-\(id)").map(\.at)
            try #require(times.count == 4)
            // Attempt n waits 1 s × 2ⁿ⁻¹ × [0.5, 1.5), plus the write-back and claim (allow
            // 0.4 s for them on a loaded machine).
            for (index, ceiling) in [1.0, 2.0, 4.0].enumerated() {
                let gap = (times[index + 1] - times[index]).seconds
                #expect(gap >= ceiling * 0.5 && gap < ceiling * 1.5 + 0.4, "retry \(index + 1) of ds-\(id) after \(gap) s")
                if index == 0 { firstGaps.append(gap) }
            }
            #expect(try await database.outboxRow(id)["attempts"] == "4")
        }
        // Jitter: five messages failed together do not come back together.
        #expect(Set(firstGaps.map { Int($0 * 100) }).count > 1, "first retry gaps \(firstGaps)")
    }

    @Test func aSlowedDownDeviceWaitsWhileOthersGoOn() async throws {
        let limited = Atomic<Bool>(false)
        let log = DownstreamLog { request, _ in
            // Only the very first message to the device hits the limit.
            guard request.to == "busy-device", !limited.exchange(true, ordering: .relaxed) else { return .ack() }
            return .nack(error: "DEVICE_MESSAGE_RATE_EXCEEDED")
        }
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (task, _) = startWorker(try ccs.downstreamWorker(database: database))
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        let first = try await database.insertOutbox([("busy-device", #"{"data":{"n":"1"}}"#)])[0]
        try await database.waitForOutbox("status = 'retry'", count: 1)
        // The simulator nacked the first message when it got it: the slowdown starts after that.
        let nackedAt = try #require(log.attempts(of: "ds-\(first)").first).at
        let insertedAt = ContinuousClock.now
        // Later messages to that device wait out the slowdown (1 s × [0.5, 1.5)); others do not.
        let later = try await database.insertOutbox([("busy-device", #"{"data":{"n":"2"}}"#), ("calm-device", #"{"data":{"n":"3"}}"#)])
        try await database.waitForOutbox("status = 'acked'", count: 3, within: .seconds(10))
        let calm = try #require(log.attempts(of: "ds-\(later[1])").first)
        let busy = try #require(log.attempts(of: "ds-\(later[0])").first)
        // The slowed-down device waits at least half a second after its nack; the other goes
        // at once, so before it (ordered, not timed: a loaded machine may take longer than a
        // fixed bound to send it, never longer than the slowdown's own wait).
        #expect(calm.at < busy.at, "the other device was held back too (calm sent \(calm.at - insertedAt) after insert)")
        #expect(busy.at - nackedAt >= .milliseconds(500), "the slowed-down device was not held back")
        #expect(log.attempts(of: "ds-\(first)").count == 2)
        #expect(log.attempts(of: "ds-\(later[0])").count == 1)
    }

    @Test func overHTTPASlowedDownDeviceWaitsToo() async throws {
        let limited = Atomic<Bool>(false)
        let ccs = try TestCCS(log: DownstreamLog())
        defer { ccs.simulator.stop() }
        let http = try FCMHTTPSimulator(senderID: TestCCS.senderID, serverKey: TestCCS.serverKey,
                                        identity: try ccs.authority.issueServerIdentity(), tokenAnswer: { token in
            token == "busy" && !limited.exchange(true, ordering: .relaxed) ? .error("DeviceMessageRateExceeded") : .success()
        })
        defer { http.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.downstreamWorker(database: database)
        configuration.httpEndpoint = "127.0.0.1:\(http.port)"
        let (task, _) = startWorker(configuration)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        _ = try await database.query("""
            INSERT INTO downstream_messages (target, transport, payload) VALUES ('busy', 'http', '{"data":{"n":"1"}}')
            """)
        try await database.waitForOutbox("status = 'retry'", count: 1)
        let insertedAt = ContinuousClock.now
        // The slowdown lasts 1 s × [0.5, 1.5) from FCM's answer: a later row to that device
        // waits it out, another device's row does not.
        let later = try await database.query("""
            INSERT INTO downstream_messages (target, transport, payload)
            VALUES ('busy', 'http', '{"data":{"n":"2"}}'), ('calm', 'http', '{"data":{"n":"3"}}') RETURNING id
            """).compactMap { $0.int(0) }
        try await database.waitForOutbox("status = 'acked'", count: 3, within: .seconds(10))
        func request(_ n: Int) throws -> FCMHTTPSimulator.Request {
            try #require(http.requests.first { $0.body.contains("\"n\":\"\(n)\"") })
        }
        let limitedAt = try request(1).receivedAt
        #expect(try request(3).receivedAt - insertedAt < .milliseconds(450), "the other device was held back too")
        #expect(try request(2).receivedAt - limitedAt > .milliseconds(450), "the slowed-down device was not held back")
        #expect(try await database.outboxRow(later[0])["attempts"] == "1")
    }
}

/// Holds every message it is given until `open` is set.
final class GateHandler: UpstreamHandler {
    let open = Atomic<Bool>(false)
    let entered = Atomic<Int>(0)

    func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
        entered.add(1, ordering: .relaxed)
        while !open.load(ordering: .relaxed) { try await Task.sleep(for: .milliseconds(10)) }
    }
}
