import FCM
import Foundation
import Postgres
import Simulator
import Testing
import Worker

/// Input that can never be handled stays cheap: it is set aside once, alone, and the
/// messages around it go on as usual.
@Suite struct PoisonInputTests {
    @Test func dataJSONBRefusesIsDeadLetteredAloneBeforeItsBatch() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.worker(database: database)
        configuration.concurrency = 1  // one lane, so what arrives together shares a batch
        configuration.pipeline.batchLinger = .milliseconds(300)
        configuration.pipeline.lingerBelow = 1_000
        let (task, events) = startWorker(configuration)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        for index in 0..<40 { ccs.simulator.injectUpstream(from: "d\(index % 4)", messageID: "ok-\(index)") }
        ccs.simulator.injectRaw(json: #"{"from":"d1","message_id":"nul","data":{"a":"x\u0000y"}}"#, messageID: "nul", from: "d1")
        ccs.simulator.injectRaw(json: #"{"from":"d2","message_id":"huge","data":{"n":1e1000000}}"#, messageID: "huge", from: "d2")
        for index in 40..<80 { ccs.simulator.injectUpstream(from: "d\(index % 4)", messageID: "ok-\(index)") }
        try await events.wait(for: "every message settled", timeout: .seconds(20)) { events in
            events.reduce(0) { total, event in
                if case .committed(let handled, _, let dead) = event { total + handled.count + dead.count } else { total }
            } >= 82
        }
        #expect(try await database.count("upstream_messages") == 80)
        let letters = try await database.query("SELECT message_id, reason, attempts, error FROM dead_letters ORDER BY message_id")
        #expect(letters.map { $0.string(0) } == ["huge", "nul"])
        #expect(letters.allSatisfy { $0.string(1) == "handler_failed" && $0.int(2) == 1 })
        #expect(letters.allSatisfy { $0.string(3)?.contains("cannot be stored as jsonb") == true })
        // No batch failed and no message was retried: the poison never reached a transaction.
        #expect(!events.all.contains { if case .retryScheduled = $0 { true } else { false } })
        let commits = events.all.filter { if case .committed = $0 { true } else { false } }.count
        #expect(commits <= 3, "\(commits) commits for one burst")
    }

    @Test func anUnknownMessageTypeIsAckedAndDeadLetteredOnce() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (task, events) = startWorker(try ccs.worker(database: database))
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        let surprise = #"{"message_type":"surprise","message_id":"s-1","from":"device","category":"com.example"}"#
        ccs.simulator.injectRaw(json: surprise, messageID: "s-1", from: "device")
        try await ccs.simulator.wait(for: "the ack") { $0.acked.contains("s-1") }
        try await events.wait(for: "the dead letter") { events in
            events.contains { if case .committed(_, _, let dead) = $0 { dead.contains("s-1") } else { false } }
        }
        // CCS redelivers it (as after a lost ack): acked again, kept once.
        ccs.simulator.injectRaw(json: surprise, messageID: "s-1", from: "device")
        ccs.simulator.injectUpstream(from: "device", messageID: "after")
        await database.waitForRows(in: "upstream_messages", count: 1, within: .seconds(10))
        try await ccs.simulator.wait(for: "the second ack") { $0.acked.filter { $0 == "s-1" }.count == 2 }
        let letters = try await database.query("SELECT reason, error, category FROM dead_letters WHERE message_id = 's-1'")
        #expect(letters.count == 1)
        #expect(letters.first?.string(0) == "unknown_type" && letters.first?.string(1) == "unknown message_type surprise")
        #expect(letters.first?.string(2) == "com.example")
        #expect(ccs.simulator.violations.isEmpty)
    }
}

/// Poison input with a timing bound (an answer due within a second), run on its own by
/// `scripts/test` (see `DownstreamTimingTests`).
@Suite struct PoisonInputTimingTests {
    @Test(arguments: [true, false])
    func aStanzaErrorWithoutAnIdHoldsNoSlotForLong(echoingPayload: Bool) async throws {
        let log = DownstreamLog { request, attempt in
            request.json["to"] == .string("refused") && attempt == 1
                ? .stanzaErrorWithoutID(condition: "bad-request", text: "InvalidJson: refused", echoingPayload: echoingPayload)
                : .ack()
        }
        let ccs = try TestCCS(log: log)
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.downstreamWorker(database: database)
        configuration.downstream.answerTimeout = .seconds(1)
        let (task, _) = startWorker(configuration)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        let ids = try await database.insertOutbox([("refused", #"{"data":{"k":"v"}}"#), ("fine", #"{"data":{"k":"v"}}"#)])
        try await database.waitForOutbox("status IN ('failed', 'acked')", count: 2, within: .seconds(15))
        let refused = try await database.outboxRow(ids[0])
        if echoingPayload {
            // The echoed payload names the message: it is settled by the error at once.
            #expect(refused["status"] == "failed" && refused["error_code"] == "STANZA_ERROR:bad-request", "\(refused)")
        } else {
            // Nothing names it: once its answer is a second late it is sent again (and acked).
            #expect(refused["status"] == "acked" && refused["attempts"] == "2", "\(refused)")
        }
        #expect(try await database.outboxRow(ids[1])["status"] == "acked")
    }
}
