/// Your code for upstream messages. Implement it in your own module and register it.
///
/// The contract:
/// - `handle` runs inside a database transaction that also records the message as
///   processed. If it returns, its effects through `context` (`execute`, `reply`, `send`)
///   commit together with that record: **exactly once** per `message_id`, even when CCS
///   redelivers or the worker restarts.
/// - The handler's **code may run more than once** for a message: when it throws, when
///   another message of its batch fails (the batch rolls back and its messages are handled
///   again one by one), and after a crash before the commit. Keep side effects outside
///   the database in `context.afterCommit`, which runs at most once, after the commit.
/// - If it throws, its effects roll back and the message is retried with backoff
///   (`--max-attempts`, 5 by default), then dead-lettered. `PermanentFailure` (and a
///   `DownstreamValidationError` from `reply`/`send`) dead-letters it at once: no retries,
///   and the rest of its batch commits without being handled one by one.
/// - Messages from one device reach a handler in arrival order, one at a time.
/// - A handler registered with a `timeout` is cancelled when it runs longer; the attempt
///   counts as failed (and is retried) once it returns.
public protocol UpstreamHandler: Sendable {
    func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws

    /// Looks at a message before its batch, outside any transaction: throw
    /// `PermanentFailure` for one this handler can never take (the `store` handler refuses
    /// data `jsonb` cannot hold), and it is dead-lettered at once, alone, instead of failing
    /// its batch. The default accepts every message.
    func check(_ message: UpstreamMessage) throws
}

extension UpstreamHandler {
    public func check(_ message: UpstreamMessage) throws {}
}

/// A handler that can take many messages in one call, for bulk writes (the built-in
/// `store` handler writes a whole batch with one statement). The worker calls
/// `handle(batch:in:)` with the matching messages of a batch, in arrival order; it falls
/// back to `handle(_:in:)` one message at a time to isolate a failure.
public protocol BatchUpstreamHandler: UpstreamHandler {
    func handle(batch messages: [UpstreamMessage], in context: BatchContext) async throws
}

/// A table in which a handler writes one row per message, keyed by its `message_id`.
public struct DeduplicationRecord: Sendable, Equatable {
    public let table: String
    public let keyColumn: String

    public init(table: String, keyColumn: String) {
        self.table = table
        self.keyColumn = keyColumn
    }
}

/// A batch handler whose rows are also the messages' de-duplication record: its batch
/// statement writes one row per message into `deduplicationRecord.table` with a plain
/// INSERT (the key column unique, so a batch meeting a message handled before fails with a
/// unique violation) in the message's transaction.
///
/// The worker then reads that table to tell redeliveries apart: a message whose id is
/// there counts as handled. When such handlers are the only ones, for every message, no
/// other record is written, and a batch commits in one round trip.
public protocol RecordsUpstreamMessages: BatchUpstreamHandler {
    var deduplicationRecord: DeduplicationRecord { get }
}

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

/// The handlers a worker runs, in registration order. Several may match one message;
/// each matching handler runs once for it, in the same transaction.
public struct UpstreamHandlers: Sendable {
    struct Route: Sendable {
        let name: String
        let match: HandlerMatch
        let handler: any UpstreamHandler
        let timeout: Duration?
    }

    private(set) var routes: [Route] = []

    public init() {}

    /// Adds `handler` under `name` (for logs, dead letters and `--handlers`) for the
    /// messages `match` selects. With a `timeout`, a call that runs longer is cancelled and
    /// fails (see `UpstreamHandler`); the database calls of `context` end at once when
    /// cancelled, code that ignores cancellation is waited for.
    public mutating func register(_ name: String, _ handler: any UpstreamHandler, for match: HandlerMatch = .all,
                                  timeout: Duration? = nil) {
        routes.append(Route(name: name, match: match, handler: handler, timeout: timeout))
    }

    /// The record every message gets from its handlers when the only handlers are
    /// `RecordsUpstreamMessages` ones for every message; nil otherwise (then the worker
    /// records each message in `processed_upstream`).
    var recordOfEveryMessage: DeduplicationRecord? {
        guard !routes.isEmpty, routes.allSatisfy({ $0.match.isAll && $0.handler is any RecordsUpstreamMessages }) else { return nil }
        return (routes.first?.handler as? any RecordsUpstreamMessages)?.deduplicationRecord
    }

    /// Every table a registered handler declares as a de-duplication record.
    var deduplicationRecords: [DeduplicationRecord] {
        var records: [DeduplicationRecord] = []
        for route in routes {
            if let record = (route.handler as? any RecordsUpstreamMessages)?.deduplicationRecord, !records.contains(record) {
                records.append(record)
            }
        }
        return records
    }

    /// These handlers restricted to `names`, in registration order.
    /// - Throws: `ConfigurationError` naming a handler that is not registered.
    public func selecting(_ names: [String]) throws(ConfigurationError) -> UpstreamHandlers {
        if let unknown = names.first(where: { name in !routes.contains { $0.name == name } }) {
            throw ConfigurationError("unknown handler \(unknown): the handlers are \(self.names.joined(separator: ", "))")
        }
        var selected = UpstreamHandlers()
        selected.routes = routes.filter { names.contains($0.name) }
        return selected
    }

    /// The registered names, in order.
    public var names: [String] { routes.map(\.name) }

    /// The categories the routes select by `.category`, in registration order, each once.
    public var categories: [String] {
        var categories: [String] = []
        for route in routes {
            if case .category(let category) = route.match, !categories.contains(category) { categories.append(category) }
        }
        return categories
    }
    public var isEmpty: Bool { routes.isEmpty }
}
