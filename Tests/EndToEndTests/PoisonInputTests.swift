import FCM
import Foundation
import Postgres
import Simulator
import Testing
import XMPP
import Transport
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

    /// A `message_id` too long for an index entry (15 KB) failed its every attempt, then its
    /// dead letter failed too, every second, forever. Now it is dead-lettered at once, under
    /// the digest of its id with its raw bytes, acked, and kept once when redelivered.
    @Test func aMessageIDTooLongToIndexIsDeadLetteredOnceUnderItsDigest() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (task, events) = startWorker(try ccs.worker(database: database))
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        let id = "long-" + String(repeating: "i", count: 15_000)
        let json = #"{"from":"device","message_id":"\#(id)","data":{"n":"1"}}"#
        ccs.simulator.injectRaw(json: json, messageID: id, from: "device")
        ccs.simulator.injectUpstream(from: "device", messageID: "after-1")
        await database.waitForRows(in: "upstream_messages", count: 1, within: .seconds(10))
        await database.waitForRows(in: "dead_letters", count: 1, within: .seconds(10))
        // Redelivered: acked again, kept once.
        ccs.simulator.injectRaw(json: json, messageID: id, from: "device")
        ccs.simulator.injectUpstream(from: "device", messageID: "after-2")
        await database.waitForRows(in: "upstream_messages", count: 2, within: .seconds(10))
        try await ccs.simulator.wait(for: "both acks") { $0.acked.filter { $0 == id }.count == 2 }
        let letters = try await database.query("SELECT message_id, reason, error, raw_payload FROM dead_letters")
        #expect(letters.count == 1)
        #expect(letters.first?.string(0) == "sha256:" + SHA256.hex(Array(id.utf8)))
        #expect(letters.first?.string(1) == "unreadable")
        #expect(letters.first?.string(2)?.contains("its message_id is 15005 bytes long") == true)
        #expect(letters.first?.string(3) == json, "its raw bytes are kept")
        #expect(!events.all.contains { if case .retryScheduled = $0 { true } else { false } }, "never retried")
    }

    /// The same stanza queued in CCS before the worker connects: it arrives while the
    /// session is being established, and every negotiation failed on it ("over the size
    /// limit, before the session was established"), the worker reconnecting for ever and
    /// acking nothing. Now it is held with the messages around it, set aside once the
    /// session is up, and acked.
    @Test func aStanzaOverTheSizeLimitWaitingAtConnectNeverBlocksTheSender() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let huge = #"{"category":"com.example","data":{"blob":"\#(String(repeating: "b", count: 2_100_000))"},"message_id":"big-0","from":"device"}"#
        ccs.simulator.injectRaw(json: huge, messageID: "big-0", from: "device")
        ccs.simulator.injectUpstream(from: "device", messageID: "after-0")
        let (task, _) = startWorker(try ccs.worker(database: database))
        defer { task.cancel() }
        try await ccs.simulator.wait(for: "both acks", timeout: .seconds(20)) { Set($0.acked).isSuperset(of: ["big-0", "after-0"]) }
        await database.waitForRows(in: "upstream_messages", count: 1, within: .seconds(10))
        await database.waitForRows(in: "dead_letters", count: 1, within: .seconds(10))
        let letters = try await database.query("SELECT message_id, reason FROM dead_letters")
        #expect(letters.first?.string(0) == "big-0" && letters.first?.string(1) == "oversized")
        #expect(ccs.simulator.counters.sessionsBound == 1, "the first session took it")
    }

    /// A stanza over 1 MiB reset the connection, and its redelivery reset it again, forever:
    /// no other message on it was acked. Now it is read to its end, acked (its message_id
    /// comes after its data, as CCS writes them), dead-lettered with its first bytes, and
    /// the connection goes on.
    @Test func aStanzaOverTheSizeLimitIsAckedSetAsideAndTheConnectionGoesOn() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (task, _) = startWorker(try ccs.worker(database: database))
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        let huge = #"{"category":"com.example","data":{"blob":"\#(String(repeating: "b", count: 1_200_000))"},"message_id":"big-1","from":"device"}"#
        ccs.simulator.injectUpstream(from: "device", messageID: "before")
        ccs.simulator.injectRaw(json: huge, messageID: "big-1", from: "device")
        ccs.simulator.injectUpstream(from: "device", messageID: "after")
        try await ccs.simulator.wait(for: "three acks", timeout: .seconds(20)) { Set($0.acked).isSuperset(of: ["before", "big-1", "after"]) }
        await database.waitForRows(in: "upstream_messages", count: 2, within: .seconds(10))
        await database.waitForRows(in: "dead_letters", count: 1, within: .seconds(10))
        let letters = try await database.query("SELECT message_id, reason, error, length(raw_payload), category FROM dead_letters")
        #expect(letters.first?.string(0) == "big-1" && letters.first?.string(1) == "oversized")
        #expect(letters.first?.string(2)?.contains("over the size limit") == true)
        #expect(letters.first?.int(3) == Int64(XMLStreamParser.oversizedSampleBytes))
        #expect(letters.first?.string(4) == "com.example")
        #expect(ccs.simulator.counters.sessionsBound == 1, "the connection was never dropped")
        #expect(ccs.simulator.violations.isEmpty)
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
