import Worker

/// `{"action": "chat", "room": "…", "text": "…"}`: stores the message and sends it on to
/// every other device of the room's members; a room of many devices gets one multicast
/// (legacy HTTP) instead of one XMPP message each. Answers `{"status": "sent", "recipients": N}`.
public struct ChatMessage: UpstreamHandler {
    public let settings: ChatSettings

    public init(settings: ChatSettings) {
        self.settings = settings
    }

    public func check(_ message: UpstreamMessage) throws {
        guard let room = message.data["room"], !room.isEmpty else { throw PermanentFailure("chat needs data.room", code: "missing_room") }
        guard let text = message.data["text"] else { throw PermanentFailure("chat needs data.text", code: "missing_text") }
        guard text.count <= settings.maximumLength else {
            throw PermanentFailure("chat text of \(text.count) characters is over the limit of \(settings.maximumLength)",
                                   code: "text_too_long")
        }
    }

    struct Recipient: Decodable {
        let token: String
    }

    public func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
        let room = message.data["room"] ?? "", text = message.data["text"] ?? ""
        let sender = try await context.query(Recipient.self, "SELECT token FROM devices WHERE token = $1", [.init(message.from)])
        guard !sender.isEmpty else { throw PermanentFailure("chat from a device that never registered", code: "unregistered_sender") }
        context.execute("INSERT INTO chat_messages (message_id, room, sender, body, sent_at) VALUES ($1, $2, $3, $4, $5)",
                        message.messageID, room, message.from, text, message.receivedAt)
        let recipients = try await context.query(Recipient.self, """
            SELECT d.token FROM room_members m JOIN devices d ON d.user_id = m.user_id
            WHERE m.room = $1 AND d.token <> $2 ORDER BY d.token
            """, [.init(room), .init(message.from)])
        let payload: [String: JSONValue] = ["room": .string(room), "text": .string(text), "sender": .string(message.from)]
        if recipients.count > settings.multicastAbove {
            try context.sendMulticast(to: recipients.map(\.token), data: payload, options: ["priority": "high"])
        } else {
            for recipient in recipients {
                try context.send(to: recipient.token, data: payload, options: ["priority": "high", "time_to_live": 3600])
            }
        }
        try context.reply(data: ["status": "sent", "recipients": JSONValue(recipients.count)])
        let logger = context.logger, count = recipients.count
        context.afterCommit { logger.info("chat in \(room) sent on to \(count) device(s)") }
    }
}
