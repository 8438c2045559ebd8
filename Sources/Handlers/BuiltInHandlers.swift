import Worker

/// The handlers `fcm-worker run --handlers a,b` can name.
public enum BuiltInHandlers {
    /// Every built-in handler by name.
    public static let all: [String: any UpstreamHandler] = ["store": StoreHandler(), "echo": EchoHandler()]

    /// The handlers named, registered for every message in the order given.
    /// - Throws: `ConfigurationError` for an unknown name.
    public static func resolve(_ names: [String]) throws(ConfigurationError) -> UpstreamHandlers {
        var handlers = UpstreamHandlers()
        for name in names {
            guard let handler = all[name] else {
                throw ConfigurationError("unknown handler \(name): built-in handlers are \(all.keys.sorted().joined(separator: ", "))")
            }
            handlers.register(name, handler)
        }
        return handlers
    }
}
