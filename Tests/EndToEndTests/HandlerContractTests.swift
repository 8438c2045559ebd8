import FCM
import Foundation
import Postgres
import Runtime
import Simulator
import Synchronization
import Testing
import Worker
import WorkerTesting
import XMPP
import TestSupport

/// Counts calls per message id, can hold the first call until released, and refuses or
/// fails the messages it is told to.
private final class ScriptedHandler: UpstreamHandler, Sendable {
    private let calls = BlockingLock<[String: Int]>([:])
    private let gate = BlockingLock<CheckedContinuation<Void, Never>?>(nil)
    private let held = BlockingLock(false)
    let holdFirst: Bool
    let announced = Announcements()

    init(holdFirst: Bool = false) {
        self.holdFirst = holdFirst
    }

    func count(_ id: String) -> Int { calls.withLock { $0[id, default: 0] } }

    /// Lets the held first call go on.
    func release() {
        held.withLock { $0 = true }
        gate.withLock { $0.take() }?.resume()
    }

    func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
        let first = calls.withLock { calls in
            calls[message.messageID, default: 0] += 1
            return calls.values.reduce(0, +) == 1
        }
        if first && holdFirst {
            await withCheckedContinuation { continuation in
                let go = held.withLock { $0 }
                if go { continuation.resume() } else { gate.withLock { $0 = continuation } }
            }
        }
        context.execute("INSERT INTO handled (message_id) VALUES ($1)", message.messageID)
        switch message.data["do"] {
        case "refuse": throw PermanentFailure("this message can never be handled", code: "never")
        case "bad-reply": try context.reply(data: ["gcm.reserved": "x"])
        case "sleep":
            try await Task.sleep(for: .seconds(30))
        case "fail": throw PlannedFailure()
        default: break
        }
        let id = message.messageID
        context.afterCommit { [announced] in announced.add(id) }
    }

    struct PlannedFailure: Error {}
}

private let handledTable = MigrationSet(name: "contract", migrations: [
    Migration(version: 1, name: "0001_handled", sql: "CREATE TABLE handled (message_id text NOT NULL);"),
])

private func fixture(_ handler: ScriptedHandler, timeout: Duration? = nil,
                     configure: (inout WorkerConfiguration) -> Void = { _ in }) async throws -> WorkerFixture {
    var handlers = UpstreamHandlers()
    handlers.register("scripted", handler, timeout: timeout)
    return try await WorkerFixture.start(handlers: handlers, migrations: [handledTable], databaseURL: try TestDatabase.baseURL,
                                         configure: configure)
}

@Suite struct HandlerContractTests {
    @Test func aPermanentFailureDeadLettersItsMessageAndTheRestOfTheBatchCommitsTogether() async throws {
        let handler = ScriptedHandler(holdFirst: true)
        // One lane, and half a second for a batch to fill: the eleven messages come as one
        // batch however slow the machine (under AddressSanitizer the default 2 ms split it).
        let fixture = try await fixture(handler) {
            $0.concurrency = 1
            $0.pipeline.batchLinger = .milliseconds(500)
        }
        // The first message holds the batch's handling until all eleven are acked: one
        // batch, in which one is refused.
        let first = fixture.sendUpstream(from: "phone", data: [:])
        var batch: [String] = []
        for index in 0..<10 {
            batch.append(fixture.sendUpstream(from: "phone", data: index == 4 ? ["do": "refuse"] : [:]))
        }
        try await fixture.simulator.wait(for: "11 acks") { $0.acked.count == 11 }
        handler.release()
        try await fixture.committed(first)
        try await fixture.deadLettered(batch[4])
        for id in batch where id != batch[4] { try await fixture.committed(id) }

        let refused = batch[4]
        let others = batch.filter { $0 != refused }
        // The refused message ran once; those before it twice (the rolled-back batch, then
        // the batch without it), those after it once: never one by one.
        #expect(handler.count(refused) == 1)
        #expect(batch[..<4].map(handler.count) == [2, 2, 2, 2])
        #expect(batch[5...].map(handler.count) == [1, 1, 1, 1, 1])
        let rows = try await fixture.query("SELECT reason, attempts, error, handler, code FROM dead_letters WHERE message_id = $1",
                                           [.init(refused)])
        #expect(rows.first?.string("reason") == "handler_failed")
        #expect(rows.first?.int("attempts") == 1)
        #expect(rows.first?.string("error")?.contains("can never be handled") == true)
        // Which handler refused it, and its reason code: columns of their own.
        #expect(rows.first?.string("handler") == "scripted")
        #expect(rows.first?.string("code") == "never")
        #expect(try await fixture.query("SELECT count(*) FROM handled").first?.int(0) == 10)
        // afterCommit ran once for each handled message, after its commit.
        #expect(Set(handler.announced.all) == Set(others + [first]))
        #expect(handler.announced.all.count == 10)
        try await fixture.stop()
    }

    @Test func aReplyFCMWouldRefuseDeadLettersAtOnceWithoutRetries() async throws {
        let handler = ScriptedHandler()
        let fixture = try await fixture(handler)
        let id = fixture.sendUpstream(from: "phone", data: ["do": "bad-reply"])
        try await fixture.deadLettered(id)
        #expect(handler.count(id) == 1)
        let rows = try await fixture.query("SELECT error, handler, code FROM dead_letters WHERE message_id = $1", [.init(id)])
        #expect(rows.first?.string("error")?.contains("data.gcm.reserved") == true)
        #expect(rows.first?.string("handler") == "scripted")
        #expect(rows.first?.string("code") == "invalid_downstream")
        #expect(try await fixture.query("SELECT count(*) FROM downstream_messages").first?.int(0) == 0)
        #expect(handler.announced.all.isEmpty)
        try await fixture.stop()
    }

    @Test func aHandlerPastItsTimeoutIsCancelledAndItsAttemptFails() async throws {
        let handler = ScriptedHandler()
        let fixture = try await fixture(handler, timeout: .milliseconds(200)) { $0.maxAttempts = 1 }
        let started = ContinuousClock.now
        let id = fixture.sendUpstream(from: "phone", data: ["do": "sleep"])
        let quick = fixture.sendUpstream(from: "other-phone", data: [:])
        try await fixture.deadLettered(id)
        #expect(ContinuousClock.now - started < .seconds(25), "the 30 s sleep was not cancelled (a hang detector: the busy pass of scripts/test has taken 10 s here)")
        try await fixture.committed(quick)
        let rows = try await fixture.query("SELECT error, handler, code FROM dead_letters WHERE message_id = $1", [.init(id)])
        #expect(rows.first?.string("error")?.contains("timeout") == true)
        #expect(rows.first?.string("handler") == "scripted")
        #expect(rows.first?.string("code") == "timeout")
        #expect(try await fixture.query("SELECT count(*) FROM handled WHERE message_id = $1", [.init(id)]).first?.int(0) == 0)
        try await fixture.stop()
    }

    @Test func stoppingTheWorkerCancelsAHandlerRunningUnderItsTimeout() async throws {
        let handler = ScriptedHandler()
        let fixture = try await fixture(handler, timeout: .seconds(3600)) { $0.shutdownTimeout = .milliseconds(300) }
        let id = fixture.sendUpstream(from: "phone", data: ["do": "sleep"])
        try await waitUntil("the handler runs") { handler.count(id) == 1 }
        let stopping = ContinuousClock.now
        try await fixture.stop()
        // The stop cancels the handling task; the handler's own task must be cancelled with it.
        #expect(ContinuousClock.now - stopping < .seconds(25), "the 30 s sleep was not cancelled by the stop (a hang detector)")
    }

    @Test func aFailedAttemptRunsNoAfterCommitAction() async throws {
        let handler = ScriptedHandler()
        let fixture = try await fixture(handler) { $0.maxAttempts = 2; $0.pipeline.retryBase = .milliseconds(10) }
        let id = fixture.sendUpstream(from: "phone", data: ["do": "fail"])
        try await fixture.deadLettered(id)
        #expect(handler.count(id) == 2)
        #expect(handler.announced.all.isEmpty)
        try await fixture.stop()
    }
}

@Suite struct WorkerFixtureTests {
    @Test func theFixtureAwaitsCommitsAndDownstreamMessagesAndTakesJSONLines() async throws {
        struct Echo: UpstreamHandler {
            func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
                try context.reply(data: ["echo": .string(message.data["text"] ?? "")])
            }
        }
        var handlers = UpstreamHandlers()
        handlers.register("echo", Echo())
        let fixture = try await WorkerFixture.start(handlers: handlers, databaseURL: try TestDatabase.baseURL)
        let ids = try fixture.sendUpstream(jsonLines: """
            # a comment, then two messages
            {"from": "phone-a", "data": {"text": "hello"}}

            {"from": "phone-b", "category": "com.example.chat", "message_id": "chosen-1", "data": {"text": "hi"}, "time_to_live": 60}
            """)
        #expect(ids.count == 2 && ids[1] == "chosen-1")
        for id in ids { try await fixture.committed(id) }
        let replies = try await fixture.downstream(to: "phone-b")
        #expect(replies.first?.json["data"] == ["echo": "hi"])
        #expect(try await fixture.downstream(to: "phone-a").first?.json["data"] == ["echo": "hello"])
        // A dead-lettered message fails the wait for its commit at once, saying so.
        do {
            try await fixture.committed("never-sent", timeout: .milliseconds(100))
            Issue.record("waited for a message never sent")
        } catch let error as SimulatorError {
            #expect(error.description.contains("timed out"))
        }
        let schema = fixture.databaseURL
        try await fixture.stop()
        #expect(schema.contains("search_path"))
    }

    @Test func badJSONLinesAreRefusedNamingTheLine() throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        for (text, reason) in [("{\"data\": {}}\nnot json", "line 2: not a JSON object"),
                               ("{\"data\": [1]}", "line 1: data must be a JSON object"),
                               ("{\"from\": 3}", "line 1: from must be a non-empty string"),
                               ("{\"message_id\": \"\"}", "line 1: message_id must be a non-empty string")] {
            do {
                try ccs.simulator.injectUpstream(jsonLines: text)
                Issue.record("accepted \(text)")
            } catch let error as SimulatorError {
                #expect(error.description == "upstream \(reason)")
            }
        }
    }

    /// A fixture whose handlers are routed by a category sends messages in that category
    /// when the test names none (it sent `com.example.app`, which no route matched, and the
    /// message was marked handled without a handler running).
    @Test func theFixtureSendsTheCategoryItsHandlersAreRoutedBy() async throws {
        let handler = ScriptedHandler()
        var handlers = UpstreamHandlers()
        handlers.register("support", handler, for: .category("com.example.supportdesk"))
        let fixture = try await WorkerFixture.start(handlers: handlers, migrations: [handledTable], databaseURL: try TestDatabase.baseURL)
        #expect(fixture.category == "com.example.supportdesk")
        let id = fixture.sendUpstream(from: "phone", data: ["ticket": "1"])
        try await fixture.committed(id)
        #expect(handler.count(id) == 1)
        let lines = try fixture.sendUpstream(jsonLines: #"{"from": "phone", "data": {}}"#)
        try await fixture.committed(lines[0])
        #expect(handler.count(lines[0]) == 1)
        // Another category reaches no handler: kept as unrouted, and the wait says so.
        let other = fixture.sendUpstream(from: "phone", data: [:], category: "com.example.app")
        try await fixture.deadLettered(other)
        #expect(handler.count(other) == 0)
        try await fixture.stop()
    }

    /// `stop()` fails the test when the simulated CCS recorded a protocol violation, unless
    /// the fixture was started expecting some.
    @Test func stoppingAFixtureFailsOnAProtocolViolationUnlessAllowed() async throws {
        for allowed in [false, true] {
            var handlers = UpstreamHandlers()
            handlers.register("scripted", ScriptedHandler())
            let fixture = try await WorkerFixture.start(handlers: handlers, migrations: [handledTable], databaseURL: try TestDatabase.baseURL,
                                                        allowsProtocolViolations: allowed)
            // A client of its own acks a message CCS never sent.
            let client = try await XMPPConnection<XMLElement>.connect(fixture.configuration.xmppClient)
            try await client.send(serialized: CCSStanza.ack(to: "phone", messageID: "never-sent"))
            try await fixture.simulator.wait(for: "the violation") { !$0.violations.isEmpty }
            await client.close()
            do {
                try await fixture.stop()
                #expect(allowed, "stop() passed a violation")
            } catch let error as SimulatorError {
                #expect(!allowed)
                #expect(error.description.contains("never-sent"), "\(error)")
            }
        }
    }
}
