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
