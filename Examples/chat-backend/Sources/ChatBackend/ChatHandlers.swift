import Handlers
import Worker

/// Every handler of the chat backend, routed by `data.action`; everything else is kept by
/// the built-in `store` handler.
public func chatHandlers(_ settings: ChatSettings) -> UpstreamHandlers {
    var handlers = UpstreamHandlers()
    handlers.register("register", RegisterDevice(), for: .when { $0.data["action"] == "register" })
    handlers.register("join", JoinRoom(), for: .when { $0.data["action"] == "join" })
    handlers.register("chat", ChatMessage(settings: settings), for: .when { $0.data["action"] == "chat" }, timeout: .seconds(5))
    handlers.register("ping", Ping(), for: .when { $0.data["action"] == "ping" })
    handlers.register("store", StoreHandler(), for: .when { !["register", "join", "chat", "ping"].contains($0.data["action"] ?? "") })
    return handlers
}
