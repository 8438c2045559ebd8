import FCM
import Foundation
import Handlers
import Postgres
import Runtime
import Simulator
import Synchronization
import Testing
import Worker
import XMPP

/// Records the order in which it handles messages (a sequence number per handling).
struct OrderRecorder: UpstreamHandler {
    func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
        context.execute("INSERT INTO handled_order (message_id, from_token, seq) VALUES ($1, $2, nextval('handled_seq'))",
                        [.text(message.messageID), .text(message.from)])
    }
}

/// Fails on purpose: `data.fail` = "always", or "N" to fail the first N attempts.
final class FlakyHandler: UpstreamHandler {
    struct Planned: Error, CustomStringConvertible { let description: String }
    private let attempts = BlockingLock<[String: Int]>([:])

    func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
        guard let plan = message.data["fail"] else { return }
        let attempt = attempts.withLock { $0[message.messageID, default: 0] += 1; return $0[message.messageID]! }
        if plan == "always" || attempt <= Int(plan) ?? 0 {
            context.execute("INSERT INTO handled_order (message_id, from_token, seq) VALUES ('never', 'never', 0)")
            throw Planned(description: "planned failure \(attempt) of \(message.messageID)")
        }
    }

    func attemptsMade(_ id: String) -> Int { attempts.withLock { $0[id] ?? 0 } }
}

@Suite struct UpstreamSemanticsTests {
    private func storeAndRecord() -> UpstreamHandlers {
        var handlers = UpstreamHandlers()
        handlers.register("store", StoreHandler())
        handlers.register("order", OrderRecorder())
        return handlers
    }

    private func addOrderTable(_ database: TestDatabase) async throws {
        let connection = try await database.connect()
        try await connection.simpleQuery("CREATE SEQUENCE handled_seq; CREATE TABLE handled_order (message_id text, from_token text, seq bigint)")
        await connection.close()
    }

    @Test func tenThousandMessagesFromAHundredDevicesAreAckedAndStoredOnceInPerDeviceOrder() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        try await addOrderTable(database)
        var configuration = try ccs.worker(database: database)
        configuration.concurrency = 4
        let (task, _) = startWorker(configuration, handlers: storeAndRecord())
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        for index in 0..<10_000 {
            ccs.simulator.injectUpstream(from: "device-\(index % 100)", data: ["n": .string("\(index)")], messageID: "m\(index)")
        }
        // CCS redelivers some of them (as after a lost ack): acked again, handled once.
        for index in stride(from: 0, to: 10_000, by: 500) {
            ccs.simulator.injectUpstream(from: "device-\(index % 100)", data: ["n": .string("\(index)")], messageID: "m\(index)")
        }
        try await ccs.simulator.wait(for: "10,020 acks", timeout: .seconds(60)) { $0.acked.count >= 10_020 }
        await database.waitForRows(in: "upstream_messages", count: 10_000, within: .seconds(30))
        #expect(try await database.count("upstream_messages") == 10_000)
        #expect(try await database.count("handled_order") == 10_000)
        #expect(try await database.count("processed_upstream") == 10_000)
        #expect(Set(ccs.simulator.events.acked).count == 10_000)
        #expect(ccs.simulator.violations.isEmpty)
        // Per device, the handling sequence follows arrival (injection) order.
        let rows = try await database.query("SELECT from_token, message_id FROM handled_order ORDER BY seq")
        var lastIndex: [String: Int] = [:]
        var outOfOrder = 0
        for row in rows {
            let device = row.string(0)!, index = Int(row.string(1)!.dropFirst())!
            if let last = lastIndex[device], last >= index { outOfOrder += 1 }
            lastIndex[device] = index
        }
        #expect(outOfOrder == 0)
        #expect(lastIndex.count == 100)
        let sample = try await database.query("SELECT from_token, category, data->>'n' FROM upstream_messages WHERE message_id = 'm4321'")
        #expect(sample.first?.values == ["device-21", "com.example.app", "4321"])
    }

    /// The de-duplication records and the store handler's rows are written with plain
    /// INSERTs (cheaper than `ON CONFLICT`), and with `store` alone its rows are the only
    /// records. A redelivery makes such a batch fail once and is then told apart, and a
    /// stored row counts as handled (here one written before the worker started).
    @Test(arguments: [true, false])
    func redeliveriesAmongNewMessagesAreHandledOnce(storeAlone: Bool) async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        try await addOrderTable(database)
        _ = try await database.query("""
            INSERT INTO upstream_messages (message_id, from_token, data, received_at)
            VALUES ('stored-before', 'device-0', '{"kept": "1"}', now())
            """)
        var configuration = try ccs.worker(database: database)
        configuration.concurrency = 1  // one lane, so what arrives together shares a batch
        configuration.pipeline.batchLinger = .milliseconds(300)
        configuration.pipeline.lingerBelow = 1_000
        var handlers = UpstreamHandlers()
        handlers.register("store", StoreHandler())
        if !storeAlone { handlers.register("order", OrderRecorder()) }
        let (task, events) = startWorker(configuration, handlers: handlers)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        for index in 0..<50 { ccs.simulator.injectUpstream(from: "device-\(index % 5)", messageID: "first-\(index)") }
        await database.waitForRows(in: "upstream_messages", count: 51, within: .seconds(20))
        // Alone in its batch, a message stored before the worker started: handled already.
        ccs.simulator.injectUpstream(from: "device-0", data: ["kept": .string("2")], messageID: "stored-before")
        try await events.wait(for: "the stored message to be recognised", timeout: .seconds(20)) { events in
            events.contains { if case .committed(_, let duplicates, _) = $0 { duplicates > 0 } else { false } }
        }
        // One burst: ten redeliveries and forty new messages.
        for index in 0..<10 { ccs.simulator.injectUpstream(from: "device-\(index % 5)", messageID: "first-\(index)") }
        for index in 0..<40 { ccs.simulator.injectUpstream(from: "device-\(index % 5)", messageID: "second-\(index)") }
        try await ccs.simulator.wait(for: "101 acks", timeout: .seconds(20)) { $0.acked.count >= 101 }
        try await events.wait(for: "every arrival to be settled", timeout: .seconds(20)) { events in
            events.reduce(0) { total, event in
                if case .committed(let handled, let duplicates, _) = event { total + handled.count + duplicates } else { total }
            } >= 101
        }
        let duplicates = events.all.reduce(0) { total, event in
            if case .committed(_, let duplicates, _) = event { total + duplicates } else { total }
        }
        #expect(duplicates == 11)
        #expect(try await database.count("upstream_messages") == 91)
        #expect(try await database.query("SELECT data->>'kept' FROM upstream_messages WHERE message_id = 'stored-before'")
            .first?.string(0) == "1", "the row stored before is kept as it was")
        if storeAlone {
            #expect(try await database.count("processed_upstream", where: "message_id NOT IN (SELECT message_id FROM upstream_messages)") == 0)
        } else {
            #expect(try await database.count("handled_order") == 90, "every handler ran once per new message")
            #expect(try await database.count("processed_upstream") == 91)
        }
        #expect(try await database.count("dead_letters") == 0)
        #expect(ccs.simulator.violations.isEmpty)
    }

    /// With `store` alone, handled messages have no `processed_upstream` row; a
    /// dead-lettered one does, and its redelivery must still not be handled again.
    @Test func withStoreAloneADeadLetteredMessageStaysDeadLetteredWhenRedelivered() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.worker(database: database)
        configuration.pipeline.maxAttempts = 2
        configuration.pipeline.retryBase = .milliseconds(50)
        let (task, events) = startWorker(configuration)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        // jsonb refuses \u0000, so storing this message fails every time.
        let unstorable = "{\"from\":\"device\",\"message_id\":\"unstorable\",\"data\":{\"a\":\"\\u0000\"}}"
        ccs.simulator.injectRaw(json: unstorable, messageID: "unstorable", from: "device")
        try await events.wait(for: "the dead letter", timeout: .seconds(20)) { events in
            events.contains { if case .committed(_, _, let dead) = $0 { dead.contains("unstorable") } else { false } }
        }
        func retries() -> Int {
            events.all.count { if case .retryScheduled("unstorable", _, _) = $0 { true } else { false } }
        }
        // Refused before its batch (jsonb cannot hold \u0000): dead-lettered at once, never retried.
        #expect(retries() == 0)
        #expect(try await database.query("SELECT outcome FROM processed_upstream WHERE message_id = 'unstorable'")
            .first?.string(0) == "dead_lettered")
        // The redelivery is acked and recognised; the next message is stored as usual.
        ccs.simulator.injectRaw(json: unstorable, messageID: "unstorable", from: "device")
        ccs.simulator.injectUpstream(from: "device", messageID: "after")
        try await events.wait(for: "the next message to commit", timeout: .seconds(20)) { events in
            events.contains { if case .committed(let handled, _, _) = $0 { handled.contains { $0.0 == "after" } } else { false } }
        }
        try await ccs.simulator.wait(for: "the redelivery's ack") { $0.acked.filter { $0 == "unstorable" }.count == 2 }
        #expect(retries() == 0, "the redelivery was not handled again")
        #expect(try await database.count("dead_letters", where: "message_id = 'unstorable'") == 1)
        #expect(try await database.count("upstream_messages") == 1)
    }

    @Test func aMessageIDHoldingANulCharacterIsDeadLetteredNotStoredUnderACutID() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (task, events) = startWorker(try ccs.worker(database: database))
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        // PostgreSQL's text holds no U+0000, and libpq cuts a C string there: stored, this id
        // would become "cut", the id of the next message, which would then count as handled.
        let nul = "{\"from\":\"device\",\"message_id\":\"cut\\u0000tail\",\"data\":{\"n\":\"1\"}}"
        ccs.simulator.injectRaw(json: nul, messageID: "cut\u{0}tail", from: "device")
        try await events.wait(for: "the dead letter", timeout: .seconds(20)) { events in
            events.contains { if case .committed(_, _, let dead) = $0 { !dead.isEmpty } else { false } }
        }
        ccs.simulator.injectUpstream(from: "device", data: ["n": "2"], messageID: "cut")
        try await events.wait(for: "the next message to commit", timeout: .seconds(20)) { events in
            events.contains { if case .committed(let handled, _, _) = $0 { handled.contains { $0.0 == "cut" } } else { false } }
        }
        let stored = try await database.query("SELECT message_id, data->>'n' FROM upstream_messages")
        #expect(stored.map { [$0.string(0), $0.string(1)] } == [["cut", "2"]])
        let letters = try await database.query("SELECT reason, error, raw_payload FROM dead_letters")
        #expect(letters.count == 1)
        #expect(letters.first?.string(0) == "unreadable")
        #expect(letters.first?.string(1)?.contains("U+0000") == true)
        #expect(letters.first?.string(2) == nul, "the payload is kept as received")
        try await ccs.simulator.wait(for: "its ack") { $0.acked.contains("cut\u{0}tail") }
    }

    @Test func durableAcksLeaveAfterTheCommitOnTheConnectionEachMessageCameIn() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.worker(database: database)
        configuration.ackMode = .durable
        configuration.connections = 3
        let committed = BlockingLock(Set<String>())
        let (task, events) = startWorker(configuration)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(3)
        for index in 0..<3_000 {
            ccs.simulator.injectUpstream(from: "device-\(index % 50)", messageID: "durable-\(index)")
        }
        try await ccs.simulator.wait(for: "3,000 acks", timeout: .seconds(60)) { $0.acked.count >= 3_000 }
        // An ack on another connection than its message's is a violation the simulator records.
        #expect(ccs.simulator.violations.isEmpty)
        #expect(Set(ccs.simulator.events.acked).count == 3_000)
        let delivered = Set(ccs.simulator.events.compactMap { if case .upstreamDelivered(let session, _) = $0 { session } else { nil } })
        #expect(delivered.count == 3, "the messages came in on every connection")
        // Every ack the worker reported was for a message already committed.
        for event in events.all {
            if case .committed(let handled, _, _) = event { committed.withLock { $0.formUnion(handled.map(\.0)) } }
            if case .acked(_, let messageID) = event {
                #expect(committed.withLock { $0.contains(messageID) }, "\(messageID) acked before its commit")
            }
        }
        #expect(try await database.count("upstream_messages") == 3_000)
    }

    @Test func aFailingHandlerIsRetriedThenDeadLetteredWhileOthersGoOn() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        try await addOrderTable(database)
        var configuration = try ccs.worker(database: database)
        configuration.pipeline.maxAttempts = 3
        configuration.pipeline.retryBase = .milliseconds(50)
        let flaky = FlakyHandler()
        var handlers = storeAndRecord()
        handlers.register("flaky", flaky)
        let (task, events) = startWorker(configuration, handlers: handlers)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        ccs.simulator.injectUpstream(from: "dev", data: ["fail": .string("always")], messageID: "doomed")
        ccs.simulator.injectUpstream(from: "dev", data: ["fail": .string("2")], messageID: "recovers")
        ccs.simulator.injectUpstream(from: "dev", messageID: "after")
        try await events.wait(for: "the dead letter", timeout: .seconds(20)) { events in
            events.contains { if case .committed(_, _, let dead) = $0 { dead.contains("doomed") } else { false } }
        }
        try await events.wait(for: "the recovered message", timeout: .seconds(20)) { events in
            events.contains { if case .committed(let handled, _, _) = $0 { handled.contains { $0.0 == "recovers" } } else { false } }
        }
        // Each attempt ran the handler; when the first failure happens inside a batch, that
        // costs one more run (rolled back) before the message is isolated.
        #expect((3...4).contains(flaky.attemptsMade("doomed")))
        #expect(flaky.attemptsMade("recovers") == 3)
        // The failing message's writes rolled back each time; the others' stayed.
        #expect(try await database.count("handled_order", where: "message_id = 'never'") == 0)
        #expect(try await database.count("upstream_messages", where: "message_id IN ('recovers', 'after')") == 2)
        #expect(try await database.count("upstream_messages", where: "message_id = 'doomed'") == 0)
        let letter = try await database.query("SELECT reason, attempts, error, from_token FROM dead_letters WHERE message_id = 'doomed'")
        #expect(letter.first?.string(0) == "handler_failed")
        #expect(letter.first?.int(1) == 3)
        #expect(letter.first?.string(2)?.contains("planned failure \(flaky.attemptsMade("doomed")) of doomed") == true)
        #expect(try await database.query("SELECT outcome FROM processed_upstream WHERE message_id = 'doomed'").first?.string(0) == "dead_lettered")
        #expect(try await database.query("SELECT outcome FROM processed_upstream WHERE message_id = 'after'").first?.string(0) == "handled")
        func retries(of id: String) -> Int {
            events.all.count { if case .retryScheduled(id, _, _) = $0 { true } else { false } }
        }
        #expect(retries(of: "doomed") == 2)  // attempts 1 and 2 are retried, attempt 3 is final
        // "recovers" fails its first two handler runs; whether the first was inside a batch
        // decides whether that took one pipeline attempt or two.
        #expect((1...2).contains(retries(of: "recovers")))
        // A redelivery of the dead-lettered message is acked and not handled again.
        ccs.simulator.injectUpstream(from: "dev", data: ["fail": .string("always")], messageID: "doomed")
        let runsBefore = flaky.attemptsMade("doomed")
        try await ccs.simulator.wait(for: "the redelivery's ack") { $0.acked.filter { $0 == "doomed" }.count == 2 }
        ccs.simulator.injectUpstream(from: "dev", messageID: "marker")
        try await events.wait(for: "a later message to commit") { events in
            events.contains { if case .committed(let handled, _, _) = $0 { handled.contains { $0.0 == "marker" } } else { false } }
        }
        #expect(flaky.attemptsMade("doomed") == runsBefore)
    }

    @Test func theStoreHandlerKeepsDataAsSentToTheLastDigit() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (task, _) = startWorker(try ccs.worker(database: database))
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        ccs.simulator.injectRaw(json: "{\"from\":\"device\",\"message_id\":\"exact\",\"data\":{\"big\":12345678901234567890,\"f\":0.1000}}",
                                messageID: "exact", from: "device")
        await database.waitForRows(in: "upstream_messages", count: 1, within: .seconds(10))
        // A Double would have made it 1.2345678901234567e19 (and 0.1000 would be 0.1).
        let rows = try await database.query("SELECT data->>'big', data->>'f' FROM upstream_messages WHERE message_id = 'exact'")
        #expect(rows.first?.values == ["12345678901234567890", "0.1000"])
    }

    @Test func unackableAndUnreadableMessagesAreDeadLetteredWithTheirRawPayload() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        let (task, _) = startWorker(try ccs.worker(database: database))
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        ccs.simulator.injectRaw(json: "{\"from\":\"device\",\"category\":\"c\",\"data\":{\"x\":\"1\"}}", messageID: nil, from: "device")
        ccs.simulator.injectRaw(json: "{not json", messageID: nil, from: nil)
        await database.waitForRows(in: "dead_letters", count: 2, within: .seconds(10))
        // By reason: the two have different devices, so they may commit in either order.
        let rows = try await database.query("SELECT reason, raw_payload, from_token FROM dead_letters ORDER BY reason")
        #expect(rows.map { $0.string(0) } == ["unackable", "unreadable"])
        #expect(rows.first?.string(1) == "{\"from\":\"device\",\"category\":\"c\",\"data\":{\"x\":\"1\"}}")
        #expect(rows.first?.string(2) == "device")
        #expect(rows.last?.string(1) == "{not json")
        #expect(ccs.simulator.events.acked.isEmpty)
    }

    @Test func aDatabaseOutageMidRunLosesNoAckedMessage() async throws {
        let ccs = try TestCCS(configure: { $0.recordsEvents = true })
        defer { ccs.simulator.stop() }
        let (database, name) = try await TestDatabase.makeDedicated()
        var configuration = try ccs.worker(database: database)
        configuration.pipeline.databaseRetryBase = .milliseconds(50)
        configuration.pipeline.databaseRetryCap = .milliseconds(200)
        let (task, events) = startWorker(configuration)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        for index in 0..<500 { ccs.simulator.injectUpstream(from: "d\(index % 10)", messageID: "a\(index)") }
        try await ccs.simulator.wait(for: "the first acks") { $0.acked.count >= 500 }
        try await TestDatabase.cutOff(name)
        for index in 0..<500 { ccs.simulator.injectUpstream(from: "d\(index % 10)", messageID: "b\(index)") }
        try await ccs.simulator.wait(for: "acks during the outage") { $0.acked.count >= 1000 }
        try await events.wait(for: "the outage to be noticed") { events in
            events.contains { if case .databaseUnavailable = $0 { true } else { false } }
        }
        try await TestDatabase.restore(name)
        await database.waitForRows(in: "upstream_messages", count: 1000, within: .seconds(20))
        #expect(try await database.count("upstream_messages") == 1000)
        // With `store` alone its rows are the records; `processed_upstream` holds at most
        // batches that were retried after a commit whose answer the outage cut off.
        #expect(try await database.count("processed_upstream", where: "message_id NOT IN (SELECT message_id FROM upstream_messages)") == 0)
    }

    @Test func whileTheDatabaseIsDownFullQueuesStopReadingSoAckingStopsThenEverythingResumes() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let (database, name) = try await TestDatabase.makeDedicated()
        var configuration = try ccs.worker(database: database)
        configuration.concurrency = 1
        configuration.pipeline.partitions = 1
        configuration.pipeline.queueCapacity = 20
        configuration.pipeline.batchSize = 10
        configuration.pipeline.databaseRetryBase = .milliseconds(50)
        configuration.pipeline.databaseRetryCap = .milliseconds(100)
        let (task, events) = startWorker(configuration)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        try await events.wait(for: "the worker's side of the session") { events in
            events.contains { if case .connected = $0 { true } else { false } }
        }
        try await TestDatabase.cutOff(name)
        for index in 0..<3000 { ccs.simulator.injectUpstream(from: "d\(index % 7)", data: ["pad": .string(String(repeating: "x", count: 500))], messageID: "q\(index)") }
        // CCS keeps at most 100 unacked messages on a connection: reaching that means the
        // worker stopped acking because it stopped reading.
        try await ccs.simulator.wait(for: "CCS's window to fill", timeout: .seconds(30)) { events in
            let delivered = events.count { if case .upstreamDelivered = $0 { true } else { false } }
            return delivered - events.acked.count >= 100
        }
        let ackedDuringOutage = ccs.simulator.events.acked.count
        #expect(ackedDuringOutage < 3000)
        try await TestDatabase.restore(name)
        try await ccs.simulator.wait(for: "every ack", timeout: .seconds(60)) { $0.acked.count >= 3000 }
        await database.waitForRows(in: "upstream_messages", count: 3000, within: .seconds(30))
        #expect(try await database.count("upstream_messages") == 3000)
        #expect(ccs.simulator.violations.isEmpty)
    }

    @Test func acksMadeWhileTheDatabaseIsDownAreSpooledAtShutdownAndReplayedAtTheNextStart() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let (database, name) = try await TestDatabase.makeDedicated()
        var configuration = try ccs.worker(database: database)
        configuration.shutdownTimeout = .milliseconds(500)
        configuration.pipeline.databaseRetryBase = .milliseconds(50)
        let (first, events) = startWorker(configuration)
        try await ccs.simulator.waitForBoundSessions(1)
        try await TestDatabase.cutOff(name)
        for index in 0..<50 { ccs.simulator.injectUpstream(from: "d", messageID: "s\(index)") }
        try await ccs.simulator.wait(for: "50 acks") { $0.acked.count >= 50 }
        first.cancel()
        try await first.value
        #expect(events.all.contains { if case .spooled(50, _) = $0 { true } else { false } })
        let spooled = try String(contentsOfFile: configuration.spoolFile, encoding: .utf8).split(separator: "\n")
        #expect(spooled.count == 50)

        try await TestDatabase.restore(name)
        let (second, replayEvents) = startWorker(configuration)
        defer { second.cancel() }
        try await replayEvents.wait(for: "the replay") { events in
            events.contains { if case .replayed(50) = $0 { true } else { false } }
        }
        #expect(try await database.count("upstream_messages") == 50)
        #expect(!FileManager.default.fileExists(atPath: configuration.spoolFile))
    }
}

/// Replies through the outbox, then fails when asked to (its reply must roll back too).
struct ReplyingHandler: UpstreamHandler {
    func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
        try context.reply(data: ["status": .string("registered")], options: ["time_to_live": .number(0)])
        let rows = try await context.query("SELECT count(*) FROM downstream_messages WHERE source_message_id = $1", [.text(message.messageID)])
        context.logger.debug("outbox rows for this message in its transaction: \(rows.first?.int(0) ?? -1)")
        if message.data["explode"] == "yes" { throw FlakyHandler.Planned(description: "explode") }
    }
}

@Suite struct HandlerRoutingTests {
    @Test func routesSelectMessagesAndRepliesCommitWithTheirMessage() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.worker(database: database)
        configuration.pipeline.maxAttempts = 1
        var handlers = UpstreamHandlers()
        handlers.register("store", StoreHandler())
        handlers.register("register", ReplyingHandler(), for: .when { $0.data["action"] == "register" })
        handlers.register("chat-only", ReplyingHandler(), for: .category("com.example.chat"))
        let (task, events) = startWorker(configuration, handlers: handlers)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        ccs.simulator.injectUpstream(from: "tok-1", data: ["action": .string("register")], messageID: "r1")
        ccs.simulator.injectUpstream(from: "tok-2", data: ["action": .string("other")], messageID: "o1")
        ccs.simulator.injectUpstream(from: "tok-3", category: "com.example.chat", data: ["action": .string("register")], messageID: "c1")
        ccs.simulator.injectUpstream(from: "tok-4", data: ["action": .string("register"), "explode": .string("yes")], messageID: "x1")
        try await events.wait(for: "all four to be settled") { events in
            let handled: [String] = events.flatMap { event -> [String] in
                guard case .committed(let handled, _, let dead) = event else { return [] }
                return handled.map(\.0) + dead
            }
            return Set(handled).isSuperset(of: ["r1", "o1", "c1", "x1"])
        }
        let replies = try await database.query("SELECT target, payload->'data'->>'status', payload->>'time_to_live', source_message_id FROM downstream_messages ORDER BY id")
        // r1 matched the predicate; c1 matched both routes (two replies); o1 none; x1's failed
        // and rolled back. Different devices commit in any order, so compare them sorted.
        #expect(replies.compactMap { $0.string(3) }.sorted() == ["c1", "c1", "r1"])
        #expect(replies.first { $0.string(3) == "r1" }?.values == ["tok-1", "registered", "0", "r1"])
        #expect(try await database.count("upstream_messages", where: "message_id IN ('r1','o1','c1')") == 3)
        #expect(try await database.count("upstream_messages", where: "message_id = 'x1'") == 0)
        #expect(try await database.count("dead_letters", where: "message_id = 'x1' AND reason = 'handler_failed'") == 1)
    }
}

@Suite struct ShutdownWithRetriesTests {
    @Test func anAckedMessageWaitingForItsRetryAtShutdownGoesToTheSpool() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.worker(database: database)
        configuration.pipeline.retryBase = .seconds(30)
        configuration.shutdownTimeout = .milliseconds(500)
        var handlers = UpstreamHandlers()
        handlers.register("flaky", FlakyHandler())
        let (task, events) = startWorker(configuration, handlers: handlers)
        try await ccs.simulator.waitForBoundSessions(1)
        ccs.simulator.injectUpstream(from: "dev", data: ["fail": .string("always")], messageID: "waiting")
        try await events.wait(for: "the retry to be scheduled") { events in
            events.contains { if case .retryScheduled("waiting", _, _) = $0 { true } else { false } }
        }
        task.cancel()
        let stopped = try await completes(within: .seconds(15)) { try await task.value }
        #expect(stopped, "shutdown did not finish")
        let spooled = try String(contentsOfFile: configuration.spoolFile, encoding: .utf8)
        #expect(spooled.contains("waiting"))
        #expect(events.all.contains { if case .spooled(1, _) = $0 { true } else { false } })
    }
}

@Suite struct MigrationTests {
    @Test func theCompiledInMigrationsAreTheRepositorysFiles() throws {
        // scripts/embed-migrations writes Sources/WorkerSchema/EmbeddedMigrations.swift from migrations/*.sql.
        let files = try MigrationSet.directory(TestDatabase.migrationsDirectory, name: MigrationSet.worker.name)
        #expect(files.migrations == MigrationSet.worker.migrations, "run scripts/embed-migrations")
        #expect(MigrationSet.worker.migrations.map(\.version) == Array(1...MigrationSet.worker.migrations.count))
    }

    @Test func migrationsAreIdempotentAndSafeWhenTwoRunAtOnce() async throws {
        let database = try await TestDatabase.make(migrated: false)
        let migrator = Migrator(sets: [.worker])
        let all = migrator.migrations.map(\.name)
        #expect(all.starts(with: ["0001_upstream", "0002_outbox", "0003_downstream_sending"]))
        let applied = try await withThrowingTaskGroup(of: [String].self) { group in
            for _ in 0..<2 {
                group.addTask {
                    let connection = try await database.connect()
                    defer { Task { await connection.close() } }
                    return try await migrator.migrate(connection)
                }
            }
            return try await group.reduce(into: [[String]]()) { $0.append($1) }
        }
        #expect(applied.flatMap { $0 }.sorted() == all)
        #expect(try await database.count("schema_migrations") == all.count)
        let connection = try await database.connect()
        #expect(try await migrator.migrate(connection).isEmpty)
        #expect(try await migrator.pending(connection).isEmpty)
        await connection.close()
    }

    @Test func aChangedMigrationIsRefusedAndABadlyNamedFileIsAnError() async throws {
        let database = try await TestDatabase.make(migrated: false)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("migrations-\(UUID())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try "CREATE TABLE a (id int);".write(toFile: directory + "/0001_a.sql", atomically: true, encoding: .utf8)
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        func migrator() throws -> Migrator { Migrator(sets: [.worker, try MigrationSet.directory(directory, name: "app")]) }
        #expect(try await migrator().migrate(connection) == MigrationSet.worker.migrations.map(\.name) + ["app/0001_a"])
        try "CREATE TABLE b (id int);".write(toFile: directory + "/0002_b.sql", atomically: true, encoding: .utf8)
        #expect(try await migrator().pending(connection) == ["app/0002_b"])
        try "CREATE TABLE a (id bigint);".write(toFile: directory + "/0001_a.sql", atomically: true, encoding: .utf8)
        do {
            _ = try await migrator().migrate(connection)
            Issue.record("a changed migration was accepted")
        } catch let error as MigrationError {
            #expect(error.description.contains("app/0001_a changed after it was applied"))
        }
        try "x".write(toFile: directory + "/12_bad.sql", atomically: true, encoding: .utf8)
        #expect(throws: MigrationError.self) { try MigrationSet.directory(directory, name: "app") }
    }

    @Test func anApplicationSetIsRecordedApartAndNumbersDoNotCollide() async throws {
        let database = try await TestDatabase.make(migrated: false)
        // Numbered like the worker's own: sets keep them apart.
        let chat = MigrationSet(name: "chat", migrations: [
            Migration(version: 2, name: "0002_rooms", sql: "CREATE TABLE rooms (id int);"),
            Migration(version: 1, name: "0001_chats", sql: "CREATE TABLE chats (id int);"),
        ])
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        let migrator = Migrator(sets: [.worker, chat])
        let applied = try await migrator.migrate(connection)
        #expect(applied.suffix(2) == ["chat/0001_chats", "chat/0002_rooms"])
        let status = try await migrator.status(connection)
        #expect(status.count == MigrationSet.worker.migrations.count + 2)
        #expect(status.allSatisfy { $0.appliedAt != nil })
        #expect(try await connection.query("SELECT count(*) FROM schema_migrations WHERE migration_set = 'chat'").first?.int(0) == 2)
        // Two migrations of one number, or two sets of one name, are refused before anything runs.
        let twice = MigrationSet(name: "chat", migrations: [Migration(version: 3, name: "a", sql: ""), Migration(version: 3, name: "b", sql: "")])
        await #expect(throws: MigrationError.self) { try await Migrator(sets: [.worker, twice]).migrate(connection) }
        await #expect(throws: MigrationError.self) { try await Migrator(sets: [.worker, chat, chat]).migrate(connection) }
    }

    @Test func anApplicationMigrationRecordedAsTheWorkersBeforeSetsIsAdopted() async throws {
        let database = try await TestDatabase.make(migrated: false)
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        // The table as a release before sets left it, with an application migration 1001
        // applied from the shared folder.
        let devices = Migration(version: 1001, name: "1001_devices", sql: "CREATE TABLE devices (token text PRIMARY KEY);\n")
        try await connection.simpleQuery("""
            CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,
                                            applied_at timestamptz NOT NULL DEFAULT now());
            """)
        try await connection.simpleQuery(devices.sql)
        try await connection.execute("INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, encode(sha256(convert_to($3, 'UTF8')), 'hex'))",
                                     [.int(1001), .text(devices.name), .text(devices.sql)])
        let applied = try await Migrator(sets: [.worker, MigrationSet(name: "app", migrations: [devices])]).migrate(connection)
        #expect(applied == MigrationSet.worker.migrations.map(\.name), "1001 is applied already: it must not run again")
        #expect(try await connection.query("SELECT migration_set FROM schema_migrations WHERE version = 1001").first?.string(0) == "app")
    }

    @Test func aConfiguredFolderThatDoesNotExistIsAConfigurationError() throws {
        var configuration = WorkerConfiguration(senderID: "1", serverKey: "k")
        configuration.migrationsDirectory = "/nonexistent/migrations"
        #expect(throws: ConfigurationError.self) { try configuration.migrator() }
        configuration.migrationsDirectory = nil
        #expect(try configuration.migrator().sets.map(\.name) == ["fcm-worker"])
        // An older deployment's copy of the worker's files in the folder is the worker's: left out.
        configuration.migrationsDirectory = TestDatabase.migrationsDirectory
        #expect(try configuration.migrator().sets.last?.migrations.isEmpty == true)
    }

    @Test func theWorkerRefusesToStartOnPendingMigrations() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make(migrated: false)
        let configuration = try ccs.worker(database: database)
        let worker = FCMWorker(configuration: configuration, handlers: UpstreamHandlers(), logger: Logger(label: "t", minimumLevel: .error) { _ in })
        do {
            try await worker.run()
            Issue.record("started with pending migrations")
        } catch let error as ConfigurationError {
            #expect(error.description.contains("pending migration"))
            #expect(error.description.contains("--migrate"))
        }
        var migrating = configuration
        migrating.migrate = true
        let task = Task { try await FCMWorker(configuration: migrating, handlers: UpstreamHandlers(),
                                              logger: Logger(label: "t", minimumLevel: .error) { _ in }).run() }
        // Migrating a fresh schema first: allow for a busy machine.
        try await ccs.simulator.waitForBoundSessions(1, timeout: .seconds(30))
        task.cancel()
        try await task.value
        #expect(try await database.count("schema_migrations") == MigrationSet.worker.migrations.count)
    }
}

/// Upstream behaviour with timing bounds, run on its own by `scripts/test` (see
/// `DownstreamTimingTests`).
@Suite struct UpstreamTimingTests {
    @Test func messagesArrivingCloseTogetherShareOneTransaction() async throws {
        let ccs = try TestCCS()
        defer { ccs.simulator.stop() }
        let database = try await TestDatabase.make()
        var configuration = try ccs.worker(database: database)
        configuration.concurrency = 1
        configuration.pipeline.partitions = 1
        configuration.pipeline.batchLinger = .seconds(2)
        let (task, events) = startWorker(configuration)
        defer { task.cancel() }
        try await ccs.simulator.waitForBoundSessions(1)
        for index in 0..<5 {
            ccs.simulator.injectUpstream(from: "device-\(index)", messageID: "close-\(index)")
            try await Task.sleep(for: .milliseconds(20))
        }
        // The worker's events, not the rows: the rows are visible from the commit on, the
        // event is recorded a moment after it (CI once read the events in between).
        func committed(_ events: [WorkerEvent]) -> [[String]] {
            events.compactMap { if case .committed(let handled, _, _) = $0 { handled.map(\.0) } else { nil } }
        }
        try await events.wait(for: "5 messages committed") { committed($0).joined().count >= 5 }
        let commits = committed(events.all)
        // Without the linger the first message commits alone while the others arrive.
        #expect(commits == [(0..<5).map { "close-\($0)" }])
    }
}
