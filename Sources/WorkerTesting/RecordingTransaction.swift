import FCM
import Foundation
import Postgres
import Runtime
import Worker

/// A handler's effects, recorded instead of committed: for unit tests of a handler,
/// without a database or FCM.
///
/// ```swift
/// let recording = RecordingTransaction()
/// recording.answer(when: "FROM devices") { _ in [["token": "t1", "platform": "android"]] }
/// let message = UpstreamMessage(from: "t1", data: ["action": "ping"])
/// try await PingHandler().handle(message, in: recording.context(for: message))
/// #expect(recording.sent.map(\.data) == [["pong": "1"]])
/// ```
///
/// Like the worker's transaction, `execute`d statements wait in `queued` until the next
/// `query`/`executeNow` moves them to `statements`; `commit()` moves the rest and runs the
/// `afterCommit` actions.
public final class RecordingTransaction: HandlerTransaction, Sendable {
    private struct Recorded {
        var queuedStatements: [PostgresStatement] = []
        var ranStatements: [PostgresStatement] = []
        var sentMessages: [OutgoingMessage] = []
        var actions: [@Sendable () async -> Void] = []
        var answers: [(matches: @Sendable (PostgresStatement) -> Bool, answer: @Sendable (PostgresStatement) throws -> PostgresResult)] = []
    }
    private let recorded = BlockingLock(Recorded())
    /// The logger handed to contexts; its lines are kept in `logLines`.
    public let logger: Logger
    private let lines = LogLines()

    public init() {
        let lines = self.lines
        logger = Logger(label: "test handler", minimumLevel: .debug) { lines.append($0) }
    }

    /// A context for `message` over this recording.
    public func context(for message: UpstreamMessage) -> HandlerContext {
        HandlerContext(message: message, logger: logger, transaction: self)
    }

    /// A batch context over this recording.
    public func batchContext() -> BatchContext {
        BatchContext(logger: logger, transaction: self)
    }

    // MARK: Scripting queries

    /// Answers the queries whose SQL contains `fragment` with `rows` (dictionaries of
    /// column → text, nil for NULL), latest scripts first. Unscripted queries return no rows.
    public func answer(when fragment: String, rows: @escaping @Sendable (PostgresStatement) throws -> [[String: String?]]) {
        answer(where: { $0.sql.contains(fragment) }) { statement in
            let table = try rows(statement)
            let columns = table.first.map { Array($0.keys).sorted() } ?? []
            return PostgresResult(rows: table.map { row in PostgresRow(columns: columns, values: columns.map { row[$0] ?? nil }) },
                                  affectedRows: table.count)
        }
    }

    /// Answers the statements `matches` selects with `answer`'s result (or error: a
    /// `PostgresError` to see how the handler takes a failing query).
    public func answer(where matches: @escaping @Sendable (PostgresStatement) -> Bool,
                       with answer: @escaping @Sendable (PostgresStatement) throws -> PostgresResult) {
        recorded.withLock { $0.answers.insert((matches, answer), at: 0) }
    }

    // MARK: What was recorded

    /// Statements sent to the database, in order (queued ones once a query or the commit sent them).
    public var statements: [PostgresStatement] { recorded.withLock { $0.ranStatements } }
    /// Statements `execute`d but not sent yet.
    public var queued: [PostgresStatement] { recorded.withLock { $0.queuedStatements } }
    /// Downstream messages queued with `reply`, `send` or `sendMulticast`, in order.
    public var sent: [OutgoingMessage] { recorded.withLock { $0.sentMessages } }
    /// The lines the handler logged.
    public var logLines: [String] { lines.all }
    /// How many `afterCommit` actions wait for `commit()`.
    public var afterCommitCount: Int { recorded.withLock { $0.actions.count } }

    /// Sends what is queued and runs the `afterCommit` actions, in order, as the worker does
    /// once the transaction committed.
    public func commit() async {
        let pending = recorded.withLock { state in
            state.ranStatements += state.queuedStatements
            state.queuedStatements.removeAll()
            defer { state.actions.removeAll() }
            return state.actions
        }
        for action in pending { await action() }
    }

    /// Drops what is queued and the `afterCommit` actions, as a rollback does.
    public func rollback() {
        recorded.withLock { state in
            state.queuedStatements.removeAll()
            state.sentMessages.removeAll()
            state.actions.removeAll()
        }
    }

    // MARK: HandlerTransaction

    public func enqueue(_ statement: PostgresStatement) {
        recorded.withLock { $0.queuedStatements.append(statement) }
    }

    public func run(_ statement: PostgresStatement) async throws -> PostgresResult {
        let answer = recorded.withLock { state -> (@Sendable (PostgresStatement) throws -> PostgresResult)? in
            state.ranStatements += state.queuedStatements
            state.queuedStatements.removeAll()
            state.ranStatements.append(statement)
            return state.answers.first { $0.matches(statement) }?.answer
        }
        return try answer?(statement) ?? PostgresResult(rows: [], affectedRows: 0)
    }

    public func send(_ message: OutgoingMessage) {
        recorded.withLock { $0.sentMessages.append(message) }
    }

    public func afterCommit(_ action: @escaping @Sendable () async -> Void) {
        recorded.withLock { $0.actions.append(action) }
    }
}

/// Lines a logger wrote.
private final class LogLines: Sendable {
    private let lines = BlockingLock<[String]>([])
    func append(_ line: String) { lines.withLock { $0.append(line) } }
    var all: [String] { lines.withLock { $0 } }
}
