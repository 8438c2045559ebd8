import Postgres

/// The open transaction of one batch: statements handlers `execute` are queued and sent
/// together in pipeline mode (one round trip) before the next query or at commit;
/// downstream messages become outbox rows; `afterCommit` actions wait for the commit.
final class UpstreamTransaction: HandlerTransaction {
    let connection: PostgresConnection
    private(set) var queued: [PostgresStatement] = []
    /// What runs once the transaction has committed.
    private(set) var afterCommitActions: [@Sendable () async -> Void] = []

    init(connection: PostgresConnection) {
        self.connection = connection
    }

    func enqueue(_ statement: PostgresStatement) {
        queued.append(statement)
    }

    func send(_ message: OutgoingMessage) {
        queued.append(OutboxInsert.statement(for: message))
    }

    func afterCommit(_ action: @escaping @Sendable () async -> Void) {
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
    func run(_ statement: PostgresStatement) async throws -> PostgresResult {
        try await flush()
        return try await connection.run(statement)
    }
}

/// Writing downstream messages into the outbox table.
enum OutboxInsert {
    static func statement(for message: OutgoingMessage) -> PostgresStatement {
        let source: PostgresValue = message.sourceMessageID.map { .text($0) } ?? .null
        let payload = PostgresValue.jsonb(message.payload.serialized)
        let transport = PostgresValue.text(message.effectiveTransport.rawValue)
        switch message.target {
        case .to(let target):
            return PostgresStatement("INSERT INTO downstream_messages (target, payload, source_message_id, transport) VALUES ($1, $2::jsonb, $3, $4)",
                                     [.text(target), payload, source, transport])
        case .condition(let condition):
            return PostgresStatement("INSERT INTO downstream_messages (condition, payload, source_message_id, transport) VALUES ($1, $2::jsonb, $3, $4)",
                                     [.text(condition), payload, source, transport])
        case .multicast(let tokens):
            return PostgresStatement("INSERT INTO downstream_messages (registration_ids, payload, source_message_id, transport) VALUES ($1::text[], $2::jsonb, $3, $4)",
                                     [.array(tokens.map { .text($0) }), payload, source, transport])
        }
    }
}
