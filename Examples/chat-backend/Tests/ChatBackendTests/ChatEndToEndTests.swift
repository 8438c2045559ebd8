import ChatBackend
import Foundation
import Testing
import Worker
import WorkerTesting

/// The whole application against a simulated FCM and a real PostgreSQL database (the one
/// `DATABASE_URL` names; run them with fcm-worker's `scripts/test-database swift test`,
/// which starts a throwaway one), awaiting what happened.
@Suite struct ChatEndToEndTests {
    static var databaseURL: String {
        get throws {
            guard let url = ProcessInfo.processInfo.environment["DATABASE_URL"] else {
                throw ChatTestSetupError(description: "set DATABASE_URL to a PostgreSQL database the tests may create schemas in, "
                                                      + "or run the tests with fcm-worker's scripts/test-database swift test")
            }
            return url
        }
    }

    struct ChatTestSetupError: Error, CustomStringConvertible {
        let description: String
    }

    @Test func twoUsersRegisterJoinARoomAndChat() async throws {
        let fixture = try await WorkerFixture.start(handlers: chatHandlers(ChatSettings()), migrations: [chatMigrations],
                                                    databaseURL: try Self.databaseURL)
        var registered: [String] = []
        for (token, user) in [("alice-phone", "alice"), ("bob-phone", "bob"), ("bob-tablet", "bob")] {
            registered.append(fixture.sendUpstream(from: token, data: ["action": "register", "user": .string(user), "platform": "android"]))
        }
        for id in registered { try await fixture.committed(id) }
        for token in ["alice-phone", "bob-phone"] {
            try await fixture.committed(fixture.sendUpstream(from: token, data: ["action": "join", "room": "lobby"]))
        }

        let chat = fixture.sendUpstream(from: "alice-phone", data: ["action": "chat", "room": "lobby", "text": "hello bob"])
        try await fixture.committed(chat)
        // Bob's two devices get it; Alice gets the answer.
        for token in ["bob-phone", "bob-tablet"] {
            let received = try await fixture.downstream(to: token) { $0.json["data"]?["text"] != nil }
            #expect(received.map { $0.json["data"] } == [["room": "lobby", "text": "hello bob", "sender": "alice-phone"]])
        }
        let answers = try await fixture.downstream(to: "alice-phone") { $0.json["data"]?["status"] == "sent" }
        #expect(answers.first?.json["data"] == ["status": "sent", "recipients": 2])
        let stored = try await fixture.query("SELECT room, body FROM chat_messages WHERE message_id = $1", [.init(chat)])
        #expect(stored.first?.string("body") == "hello bob")

        // A chat over the limit is dead-lettered at once, and nothing is sent for it.
        let long = fixture.sendUpstream(from: "alice-phone", data: ["action": "chat", "room": "lobby", "text": .string(String(repeating: "x", count: 1001))])
        try await fixture.deadLettered(long)
        // Anything else is stored by the built-in handler.
        let other = fixture.sendUpstream(from: "bob-phone", data: ["action": "typing"])
        try await fixture.committed(other)
        #expect(try await fixture.query("SELECT count(*) FROM upstream_messages WHERE message_id = $1", [.init(other)]).first?.int(0) == 1)
        try await fixture.stop()
    }

    @Test func aBigRoomIsSentOneMulticastOverHTTP() async throws {
        var settings = ChatSettings()
        settings.multicastAbove = 1
        let fixture = try await WorkerFixture.start(handlers: chatHandlers(settings), migrations: [chatMigrations],
                                                    databaseURL: try Self.databaseURL)
        for (token, user) in [("ann", "ann"), ("ben-1", "ben"), ("ben-2", "ben")] {
            try await fixture.committed(fixture.sendUpstream(from: token, data: ["action": "register", "user": .string(user)]))
            try await fixture.committed(fixture.sendUpstream(from: token, data: ["action": "join", "room": "big"]))
        }
        try await fixture.committed(fixture.sendUpstream(from: "ann", data: ["action": "chat", "room": "big", "text": "all"]))
        _ = try await fixture.downstream(to: "ann") { $0.json["data"]?["status"] == "sent" }
        // The outbox sends the multicast row once the transaction committed.
        let body = try JSONValue.parse(try await fixture.httpRequests().first!.body)
        #expect(body["registration_ids"] == ["ben-1", "ben-2"])
        try await fixture.stop()
    }
}
