import Worker

/// The built-in `echo` handler: replies to the sender with the same data (an outbox row,
/// committed with the message). Used by the demo.
public struct EchoHandler: UpstreamHandler {
    public init() {}

    public func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
        try context.reply(data: message.rawData)
    }
}
