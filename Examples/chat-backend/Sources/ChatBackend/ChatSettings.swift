import Worker

/// The chat backend's own settings: flags and environment variables beside the worker's
/// (`chat-backend help run` lists them).
public struct ChatSettings: Sendable {
    /// Longer chat messages are refused (dead-lettered at once).
    public var maximumLength = 1000
    /// Rooms with more members than this get one multicast request (legacy HTTP) instead
    /// of a message per device over XMPP.
    public var multicastAbove = 3

    public init() {}

    /// The options `WorkerMain.run(settings:options:)` adds to `run`.
    public static let options: [CommandOption<ChatSettings>] = [
        .integer("--chat-max-length", environment: "CHAT_MAX_LENGTH", default: "1000",
                 help: "longest chat message accepted, in characters", name: "chat maximum length",
                 range: 1...100_000, \.maximumLength),
        .integer("--chat-multicast-above", environment: "CHAT_MULTICAST_ABOVE", default: "3",
                 help: "rooms with more devices than this are sent one multicast over legacy HTTP", name: "multicast threshold",
                 range: 1...1000, \.multicastAbove),
    ]
}
