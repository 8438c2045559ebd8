import Worker

/// `{"action": "join", "room": "…"}`: adds the sender's user to a room.
public struct JoinRoom: UpstreamHandler {
    public init() {}

    struct Device: Decodable {
        let user_id: String
    }

    public func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
        guard let room = message.data["room"], !room.isEmpty else { throw PermanentFailure("join needs data.room") }
        guard let device = try await context.query(Device.self, "SELECT user_id FROM devices WHERE token = $1", [.init(message.from)]).first else {
            throw PermanentFailure("join from a device that never registered")
        }
        context.execute("INSERT INTO room_members (room, user_id) VALUES ($1, $2) ON CONFLICT DO NOTHING", room, device.user_id)
        try context.reply(data: ["status": "joined", "room": .string(room)])
    }
}
