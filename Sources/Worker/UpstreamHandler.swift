/// Your code for upstream messages. Implement it in your own module and register it.
///
/// `handle` runs inside a database transaction that also records the message as
/// processed: if it returns, its writes (through `context`) commit together with that
/// record, exactly once per `message_id` even when CCS redelivers; if it throws, its
/// writes roll back and the message is retried with backoff, then dead-lettered.
/// Messages from one device reach a handler in arrival order.
public protocol UpstreamHandler: Sendable {
    func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws
}

/// A handler that can take many messages in one call, for bulk writes (the built-in
/// `store` handler writes a whole batch with one statement). The worker calls
/// `handle(batch:in:)` with the matching messages of a batch, in arrival order; it falls
/// back to `handle(_:in:)` one message at a time to isolate a failure.
public protocol BatchUpstreamHandler: UpstreamHandler {
    func handle(batch messages: [UpstreamMessage], in context: BatchContext) async throws
}

/// A handler whose batch write stores each message as a row of `upstream_messages` with a
/// plain INSERT (unique `message_id`, so a message stored before fails the batch with a
/// unique violation). Such a row commits with the message's handling, so the worker also
/// reads it as the message's de-duplication record. Only the built-in `store` handler is one.
package protocol StoresUpstreamMessages: BatchUpstreamHandler {}

/// Which messages a handler gets.
public enum HandlerMatch: Sendable {
    /// Every upstream message.
    case all
    /// Messages whose `category` is this one.
    case category(String)
    /// Messages for which the predicate holds, e.g. `{ $0.data["action"] == "register" }`.
    case when(@Sendable (UpstreamMessage) -> Bool)

    var isAll: Bool { if case .all = self { true } else { false } }

    func matches(_ message: UpstreamMessage) -> Bool {
        switch self {
        case .all: true
        case .category(let category): message.category == category
        case .when(let predicate): predicate(message)
        }
    }
}

/// The handlers a worker runs, in registration order. Several may match one message;
/// each matching handler runs once for it, in the same transaction.
public struct UpstreamHandlers: Sendable {
    struct Route: Sendable {
        let name: String
        let match: HandlerMatch
        let handler: any UpstreamHandler
    }

    private(set) var routes: [Route] = []

    public init() {}

    /// Adds `handler` under `name` (for logs and dead letters) for the messages `match` selects.
    public mutating func register(_ name: String, _ handler: any UpstreamHandler, for match: HandlerMatch = .all) {
        routes.append(Route(name: name, match: match, handler: handler))
    }

    /// True when the only handlers are `StoresUpstreamMessages` ones for every message: then
    /// each message's stored row is its de-duplication record, and `processed_upstream`
    /// only keeps dead-lettered messages.
    var storedRowsRecordEveryMessage: Bool {
        !routes.isEmpty && routes.allSatisfy { $0.match.isAll && $0.handler is any StoresUpstreamMessages }
    }

    /// The registered names, in order.
    public var names: [String] { routes.map(\.name) }
    public var isEmpty: Bool { routes.isEmpty }
}
