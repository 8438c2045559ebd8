import Postgres

/// The open transaction of one batch: statements handlers `execute` are queued and sent
/// together in pipeline mode (one round trip) before the next query or at commit;
/// downstream messages become outbox rows; `afterCommit` actions wait for the commit.
package final class UpstreamTransaction: HandlerTransaction {
    let connection: PostgresConnection
    private(set) var queued: [PostgresStatement] = []
    /// What runs once the transaction has committed.
    private(set) var afterCommitActions: [@Sendable () async -> Void] = []

    init(connection: PostgresConnection) {
        self.connection = connection
    }

    package func enqueue(_ statement: PostgresStatement) {
        queued.append(statement)
    }

    package func send(_ message: OutgoingMessage) {
        queued.append(OutboxInsert.statement(for: message))
    }

    package func afterCommit(_ action: @escaping @Sendable () async -> Void) {
        afterCommitActions.append(action)
    }

    /// Drops the queued statements and actions (after a rollback).
    func discard() {
        queued.removeAll(keepingCapacity: true)
        afterCommitActions.removeAll()
    }

    /// Sends the queued statements.
    func flush() async throws {
        guard !queued.isEmpty else { return }
        let statements = queued
        queued.removeAll(keepingCapacity: true)
        _ = try await connection.pipeline(statements)
    }

    /// Runs a statement now, after the queued statements.
    package func run(_ statement: PostgresStatement) async throws -> PostgresResult {
        try await flush()
        return try await connection.run(statement)
    }
}

/// Writing downstream messages into the outbox table.
package enum OutboxInsert {
    /// The row's INSERT; a message that names no transport leaves the column to its
    /// default (the outbox's default transport).
    static func statement(for message: OutgoingMessage) -> PostgresStatement {
        let source: PostgresValue = message.sourceMessageID.map { .text($0) } ?? .null
        let payload = PostgresValue.jsonb(message.payload.serialized)
        let (column, value): (String, PostgresValue)
        switch message.target {
        case .to(let target): (column, value) = ("target", .text(target))
        case .condition(let condition): (column, value) = ("condition", .text(condition))
        case .multicast(let tokens): (column, value) = ("registration_ids", .array(tokens.map { .text($0) }))
        }
        let cast = column == "registration_ids" ? "::text[]" : ""
        guard message.transport != nil else {
            return PostgresStatement("INSERT INTO downstream_messages (\(column), payload, source_message_id) VALUES ($1\(cast), $2::jsonb, $3)",
                                     [value, payload, source])
        }
        return PostgresStatement("INSERT INTO downstream_messages (\(column), payload, source_message_id, transport) VALUES ($1\(cast), $2::jsonb, $3, $4)",
                                 [value, payload, source, .text(message.effectiveTransport.rawValue)])
    }
}
