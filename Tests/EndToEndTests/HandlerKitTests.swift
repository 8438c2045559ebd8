import FCM
import Handlers
import Foundation
import Postgres
import Runtime
import Simulator
import Synchronization
import Testing
import Worker
import WorkerTesting

/// A handler as an application writes one: reads a table, replies, sends to a topic, and
/// announces the commit.
private struct PingHandler: UpstreamHandler {
    var announced = Announcements()

    func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
        let devices = try await context.query(DeviceRow.self, "SELECT token, platform, seen FROM devices WHERE token = $1", [.init(message.from)])
        context.execute("UPDATE devices SET seen = seen + 1 WHERE token = $1", message.from)
        try context.reply(data: ["pong": "1", "platform": .string(devices.first?.platform ?? "unknown")])
        try context.send(condition: "'pings' in topics", data: ["who": .string(message.from)])
        let id = message.messageID
        context.afterCommit { [announced] in announced.add(id) }
    }

    struct DeviceRow: Decodable {
        let token: String
        let platform: String?
        let seen: Int
    }
}

/// What `afterCommit` actions announced, in order.
final class Announcements: Sendable {
    private let items = BlockingLock<[String]>([])
    func add(_ item: String) { items.withLock { $0.append(item) } }
    var all: [String] { items.withLock { $0 } }
}

@Suite struct HandlerUnitKitTests {
    @Test func aRecordingContextCapturesWritesRepliesAndSendsAndAnswersScriptedQueries() async throws {
        let recording = RecordingTransaction()
        recording.answer(when: "FROM devices") { statement in
            #expect(statement.parameters == [.text("phone-1")])
            return [["token": "phone-1", "platform": "android", "seen": "3"]]
        }
        let announced = Announcements()
        let message = UpstreamMessage(from: "phone-1", data: ["action": "ping"], category: "com.example.chat", messageID: "m1")
        try await PingHandler(announced: announced).handle(message, in: recording.context(for: message))

        #expect(recording.statements.map(\.sql) == ["SELECT token, platform, seen FROM devices WHERE token = $1"])
        #expect(recording.queued == [PostgresStatement("UPDATE devices SET seen = seen + 1 WHERE token = $1", [.text("phone-1")])])
        #expect(recording.sent == [
            OutgoingMessage(.to("phone-1"), data: ["pong": "1", "platform": "android"], sourceMessageID: "m1"),
            OutgoingMessage(.condition("'pings' in topics"), data: ["who": "phone-1"], sourceMessageID: "m1"),
        ])
        // afterCommit waits for the commit, and runs once.
        #expect(announced.all.isEmpty)
        #expect(recording.afterCommitCount == 1)
        await recording.commit()
        await recording.commit()
        #expect(announced.all == ["m1"])
        #expect(recording.statements.count == 2)
    }

    @Test func theStoreHandlerWritesABatchAsOneCopy() async throws {
        let recording = RecordingTransaction()
        let received = Date(timeIntervalSince1970: 1_764_500_000)
        let messages = [UpstreamMessage(from: "phone-1", data: ["a": "1"], category: "com.example.chat", messageID: "m1", receivedAt: received),
                        UpstreamMessage(from: "phone-2", data: [:], category: nil, messageID: "m2", receivedAt: received)]
        try await StoreHandler().handle(batch: messages, in: recording.batchContext())
        let copy = try #require(recording.queued.first)
        #expect(recording.queued.count == 1)
        #expect(copy.sql == "COPY \"upstream_messages\" (\"message_id\", \"from_token\", \"category\", \"data\", \"received_at\") FROM STDIN")
        #expect(copy.copyRows == [[.text("m1"), .text("phone-1"), .text("com.example.chat"), .jsonb("{\"a\":\"1\"}"), .timestamptz(received)],
                                  [.text("m2"), .text("phone-2"), .null, .jsonb("{}"), .timestamptz(received)]])
    }

    @Test func aReplyFCMWouldRefuseThrowsAtTheCallAndQueuesNothing() throws {
        let recording = RecordingTransaction()
        let context = recording.context(for: UpstreamMessage(from: "phone-1"))
        #expect(throws: DownstreamValidationError.self) { try context.reply(data: ["google.key": "x"]) }
        #expect(throws: DownstreamValidationError.self) { try context.reply(data: [:], options: ["time_to_live": 2_419_201]) }
        #expect(throws: DownstreamValidationError.self) { try context.reply(data: [:], options: ["priority": "urgent"]) }
        #expect(throws: DownstreamValidationError.self) { try context.reply(data: ["big": .string(String(repeating: "x", count: 5000))]) }
        #expect(throws: DownstreamValidationError.self) { try context.send(to: "/topics/bad topic", data: [:]) }
        #expect(throws: DownstreamValidationError.self) { try context.send(condition: "'a' in topics &&", data: [:]) }
        #expect(throws: DownstreamValidationError.self) { try context.sendMulticast(to: [], data: [:]) }
        #expect(throws: DownstreamValidationError.self) { try context.sendMulticast(to: ["a"], data: [:], options: ["delivery_receipt_requested": true]) }
        #expect(recording.sent.isEmpty)
        #expect(throws: DownstreamValidationError.self) {
            try context.sendMulticast(to: ["a"], data: [:], options: ["delivery_receipt_requested": true], transport: .v1)
        }
        try context.sendMulticast(to: ["a", "b"], data: ["x": 1])
        // The outbox's default (XMPP unless changed) turns a multicast to legacy HTTP.
        #expect(recording.sent.first?.effectiveTransport == .http && recording.sent.first?.transport == nil)
        try context.sendMulticast(to: ["a", "b"], data: ["x": 1], transport: .http)
        #expect(recording.sent.last?.effectiveTransport == .http)
        try context.sendMulticast(to: ["a", "b"], data: ["x": 1], transport: .v1)
        #expect(recording.sent.last?.effectiveTransport == .v1)
    }

    @Test func jsonValuesHaveLiteralsAndBridgeToCodable() throws {
        struct Chat: Codable, Equatable {
            let room: String
            let members: [String]
            let unread: Int
            let muted: Bool?
        }
        let value: JSONValue = ["room": "lobby", "members": ["a", "b"], "unread": 3, "ratio": 0.5, "muted": nil, "ok": true]
        #expect(value["room"] == .string("lobby"))
        #expect(value["unread"]?.intValue == 3)
        #expect(value["ratio"]?.doubleValue == 0.5)
        #expect(value["ok"]?.boolValue == true)
        #expect(value["muted"] == .null)
        let chat = try value.decode(Chat.self)
        #expect(chat == Chat(room: "lobby", members: ["a", "b"], unread: 3, muted: nil))
        let encoded = try JSONValue(encoding: chat)
        #expect(encoded["members"] == ["a", "b"])
        #expect(try encoded.decode(Chat.self) == chat)
        // Whole numbers survive the trip whole.
        #expect(try JSONValue(encoding: ["n": Int64.max])["n"]?.serialized == "9223372036854775807")
    }

    /// `decodeData` reads `data` into a `Decodable` type; what does not fit is a
    /// `PermanentFailure` (dead-lettered at once) naming the field.
    @Test func dataDecodesIntoATypeAndWhatDoesNotFitIsAPermanentFailureNamingTheField() throws {
        struct Ticket: Decodable, Equatable {
            let subject: String
            let priority: String?
            let tags: [String]
        }
        let message = UpstreamMessage(from: "phone", data: ["subject": "printer", "tags": ["a", "b"]])
        #expect(try message.decodeData(Ticket.self) == Ticket(subject: "printer", priority: nil, tags: ["a", "b"]))
        let missing = UpstreamMessage(from: "phone", data: ["tags": []])
        #expect(throws: PermanentFailure.self) { try missing.decodeData(Ticket.self) }
        do {
            _ = try missing.decodeData(Ticket.self)
        } catch {
            #expect(error.code == "invalid_data")
            #expect(error.description == "data does not fit Ticket: data.subject is missing")
        }
        let wrong = UpstreamMessage(from: "phone", data: ["subject": "x", "tags": ["a", 3]])
        do {
            _ = try wrong.decodeData(Ticket.self)
            Issue.record("decoded a number as a string")
        } catch {
            #expect(error.description == "data does not fit Ticket: data.tags.1 is not String")
        }
    }

    @Test func swiftValuesBecomeStatementParameters() throws {
        let date = Date(timeIntervalSince1970: 1_700_000_000.25)
        let id = UUID(uuidString: "6F9619FF-8B86-D011-B42D-00C04FC964FF")!
        #expect(PostgresValue("a") == .text("a"))
        #expect(PostgresValue(3) == .int(3))
        #expect(PostgresValue(2.5) == .double(2.5))
        #expect(PostgresValue(true) == .bool(true))
        #expect(PostgresValue(date) == .timestamptz(date))
        #expect(PostgresValue(Data([1, 2])) == .bytea([1, 2]))
        #expect(PostgresValue(id) == .text("6f9619ff-8b86-d011-b42d-00c04fc964ff"))
        #expect(PostgresValue(["a", "b"]) == .array([.text("a"), .text("b")]))
        #expect(PostgresValue(Optional<Int>.none) == .null)
        #expect(try PostgresValue.json(["b": 2, "a": 1]) == .jsonb(#"{"a":1,"b":2}"#))
        #expect(JSONValue.object(["k": "v"]).postgresValue == .jsonb(#"{"k":"v"}"#))
    }
}

@Suite struct HandlerDatabaseKitTests {
    @Test func rowsDecodeIntoSwiftTypesByColumnName() async throws {
        struct Profile: Decodable, Equatable {
            struct Settings: Decodable, Equatable { let theme: String; let sizes: [Int] }
            let name: String
            let age: Int
            let score: Double
            let active: Bool
            let joined: Date
            let avatar: Data
            let id: UUID
            let tags: [String]
            let counts: [Int?]
            let settings: Settings
            let nickname: String?
            let missing: String?
        }
        let database = try await TestDatabase.make(migrated: false)
        let connection = try await database.connect()
        defer { Task { await connection.close() } }
        let rows = try await connection.query("""
            SELECT 'Ada' AS name, 36 AS age, 9.5::float8 AS score, true AS active,
                   '2024-05-01 12:00:00.5+00'::timestamptz AS joined, '\\x0102ff'::bytea AS avatar,
                   '6f9619ff-8b86-d011-b42d-00c04fc964ff'::uuid AS id, ARRAY['a', 'b c', 'd"e'] AS tags,
                   ARRAY[1, NULL, 3] AS counts, '{"theme": "dark", "sizes": [1, 2]}'::jsonb AS settings,
                   NULL::text AS nickname
            """)
        let profile = try rows[0].decode(Profile.self)
        #expect(profile == Profile(name: "Ada", age: 36, score: 9.5, active: true, joined: Date(timeIntervalSince1970: 1_714_564_800.5),
                                   avatar: Data([1, 2, 255]), id: UUID(uuidString: "6f9619ff-8b86-d011-b42d-00c04fc964ff")!,
                                   tags: ["a", "b c", "d\"e"], counts: [1, nil, 3], settings: .init(theme: "dark", sizes: [1, 2]),
                                   nickname: nil, missing: nil))
        // A column whose text is not the type is an error naming the column.
        struct Wrong: Decodable { let name: Int }
        do {
            _ = try rows[0].decode(Wrong.self)
            Issue.record("decoded text as an Int")
        } catch let error as DecodingError {
            #expect("\(error)".contains("column name"))
        }
        // Parameters from Swift values round-trip.
        let back = try await connection.query("SELECT $1::timestamptz AS joined, $2::bytea AS avatar, $3::uuid AS id, $4::text[] AS tags",
                                              [.init(profile.joined), .init(profile.avatar), .init(profile.id), .init(profile.tags)])
        struct Back: Decodable, Equatable { let joined: Date; let avatar: Data; let id: UUID; let tags: [String] }
        #expect(try back[0].decode(Back.self) == Back(joined: profile.joined, avatar: profile.avatar, id: profile.id, tags: profile.tags))
    }
}

/// The test kit's v1 side, as docs/handlers.md shows it: a handler that replies over FCM's
/// HTTP v1 API, run in a fixture whose worker holds the simulated v1 API's service account.
@Suite struct HandlerKitV1Tests {
    private struct PingOverV1: UpstreamHandler {
        func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
            try context.reply(data: ["pong": .string(message.data["ping"] ?? "")], options: ["priority": "high"], transport: .v1)
        }
    }

    @Test func aReplyOverV1IsAwaitedAndInspectedAsFCMGotIt() async throws {
        var handlers = UpstreamHandlers()
        handlers.register("ping", PingOverV1())
        let fixture = try await WorkerFixture.start(handlers: handlers, databaseURL: try TestDatabase.baseURL)
        let id = fixture.sendUpstream(from: "ios-phone-1", data: ["ping": "42"])
        try await fixture.committed(id)
        let sent = try await fixture.v1Deliveries(to: "ios-phone-1") { $0.message["data"]?["pong"] == "42" }
        #expect(sent.count == 1)
        #expect(sent.first?.message["android"]?["priority"] == "HIGH")
        #expect(sent.first?.message["apns"] == nil)
        #expect(sent.first?.headers["x-goog-api-format-version"] == "2")
        #expect(fixture.allV1Deliveries.count == 1 && fixture.allDownstream.isEmpty, "nothing went over CCS")
        try await fixture.waitForAckedV1Row()
        try await fixture.stop()
    }
}

private extension WorkerFixture {
    /// Waits for the v1 row's answer to be written back.
    func waitForAckedV1Row() async throws {
        let deadline = ContinuousClock.now + .seconds(10)
        while try await query("SELECT count(*) FROM downstream_messages WHERE transport = 'v1' AND status = 'acked'").first?.int(0) != 1 {
            guard ContinuousClock.now < deadline else {
                Issue.record("the v1 row was not acked within 10 s")
                return
            }
            try await Task.sleep(for: .milliseconds(20))
        }
    }
}
