import Worker

/// `{"action": "register", "user": "…", "platform": "android"}`: records the sender's
/// token for the user and answers `{"status": "registered"}`.
public struct RegisterDevice: UpstreamHandler {
    public init() {}

    /// A registration without a user can never succeed: refused before its batch.
    public func check(_ message: UpstreamMessage) throws {
        guard let user = message.data["user"], !user.isEmpty else { throw PermanentFailure("register needs data.user") }
    }

    public func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
        context.execute("""
            INSERT INTO devices (token, user_id, platform, registered_at) VALUES ($1, $2, $3, $4)
            ON CONFLICT (token) DO UPDATE SET user_id = excluded.user_id, platform = excluded.platform,
                                              registered_at = excluded.registered_at
            """, message.from, message.data["user"] ?? "", message.data["platform"] ?? "unknown", message.receivedAt)
        try context.reply(data: ["status": "registered"])
    }
}
