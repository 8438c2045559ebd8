/// Which messages a handler gets.
public enum HandlerMatch: Sendable {
    /// Every upstream message.
    case all
    /// Messages whose `category` is this one.
    case category(String)
    /// Messages for which the predicate holds, e.g. `{ $0.data["action"] == "register" }`.
    case when(@Sendable (UpstreamMessage) -> Bool)

    var isAll: Bool { if case .all = self { true } else { false } }

    /// What it selects, for logs and dead letters.
    var summary: String {
        switch self {
        case .all: "every message"
        case .category(let category): "category \"\(category)\""
        case .when: "a predicate"
        }
    }

    func matches(_ message: UpstreamMessage) -> Bool {
        switch self {
        case .all: true
        case .category(let category): message.category == category
        case .when(let predicate): predicate(message)
        }
    }
}
