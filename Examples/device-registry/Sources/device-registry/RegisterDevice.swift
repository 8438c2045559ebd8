import Worker

/// Keeps a table of devices: a message with `data.action == "register"` records the
/// sender's token and platform, and answers `{"status": "registered"}`.
///
/// Its writes and its reply commit in the message's transaction, exactly once per message
/// id, together with everything else the other handlers wrote for that message.
struct RegisterDevice: UpstreamHandler {
    func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
        context.execute("""
            INSERT INTO devices (token, platform, registered_at) VALUES ($1, $2, $3)
            ON CONFLICT (token) DO UPDATE SET platform = excluded.platform, registered_at = excluded.registered_at
            """, message.from, message.data["platform"] ?? "unknown", message.receivedAt)
        try context.reply(data: ["status": "registered"])
        context.logger.info("registered \(message.from.prefix(12))…")
    }
}
