import Worker

/// `{"action": "ping"}`: answers `{"pong": "<message id>"}` with a short time to live.
public struct Ping: UpstreamHandler {
    public init() {}

    public func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
        try context.reply(data: ["pong": .string(message.messageID)], options: ["time_to_live": 60])
    }
}
