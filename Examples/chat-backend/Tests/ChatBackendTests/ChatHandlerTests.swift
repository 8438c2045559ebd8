import ChatBackend
import Testing
import Worker
import WorkerTesting

/// The handlers alone: no database, no FCM. `RecordingTransaction` answers their queries
/// and records what they write and send.
@Suite struct ChatHandlerTests {
    @Test func aChatIsStoredAndSentToEveryOtherDeviceOfTheRoom() async throws {
        let recording = RecordingTransaction()
        recording.answer(when: "FROM devices WHERE token") { _ in [["token": "alice-phone"]] }
        recording.answer(when: "FROM room_members") { statement in
            #expect(statement.parameters == ["lobby", "alice-phone"])
            return [["token": "bob-phone"], ["token": "carol-phone"]]
        }
        let message = UpstreamMessage(from: "alice-phone", data: ["action": "chat", "room": "lobby", "text": "hi"], messageID: "m1")
        try await ChatMessage(settings: ChatSettings()).handle(message, in: recording.context(for: message))

        // The insert was sent before the second query (statements run in order).
        #expect(recording.statements.map(\.sql).contains { $0.hasPrefix("INSERT INTO chat_messages") })
        let payload: [String: JSONValue] = ["room": "lobby", "text": "hi", "sender": "alice-phone"]
        #expect(recording.sent.map(\.target) == [.to("bob-phone"), .to("carol-phone"), .to("alice-phone")])
        #expect(recording.sent.prefix(2).allSatisfy { $0.data == payload && $0.options["priority"] == "high" })
        #expect(recording.sent.last?.data == ["status": "sent", "recipients": 2])
        #expect(recording.afterCommitCount == 1)
    }

    @Test func aBigRoomGetsOneMulticast() async throws {
        let recording = RecordingTransaction()
        recording.answer(when: "FROM devices WHERE token") { _ in [["token": "alice-phone"]] }
        recording.answer(when: "FROM room_members") { _ in (1...5).map { ["token": "phone-\($0)"] } }
        var settings = ChatSettings()
        settings.multicastAbove = 3
        let message = UpstreamMessage(from: "alice-phone", data: ["action": "chat", "room": "big", "text": "hello all"])
        try await ChatMessage(settings: settings).handle(message, in: recording.context(for: message))
        #expect(recording.sent.first?.target == .multicast((1...5).map { "phone-\($0)" }))
        #expect(recording.sent.first?.effectiveTransport == .http)
    }

    @Test func whatCanNeverSucceedIsRefusedForGood() async throws {
        var settings = ChatSettings()
        settings.maximumLength = 5
        let chat = ChatMessage(settings: settings)
        #expect(throws: PermanentFailure.self) { try chat.check(UpstreamMessage(from: "a", data: ["action": "chat", "room": "r", "text": "too long"])) }
        #expect(throws: PermanentFailure.self) { try chat.check(UpstreamMessage(from: "a", data: ["action": "chat", "text": "hi"])) }
        #expect(throws: PermanentFailure.self) { try RegisterDevice().check(UpstreamMessage(from: "a", data: ["action": "register"])) }

        // A chat from a device nobody registered.
        let recording = RecordingTransaction()
        let message = UpstreamMessage(from: "stranger", data: ["action": "chat", "room": "r", "text": "hi"])
        await #expect(throws: PermanentFailure.self) { try await chat.handle(message, in: recording.context(for: message)) }
        #expect(recording.sent.isEmpty)
    }

    @Test func theRoutesSendEachActionToItsHandler() {
        let handlers = chatHandlers(ChatSettings())
        #expect(handlers.names == ["register", "join", "chat", "ping", "store"])
    }
}
