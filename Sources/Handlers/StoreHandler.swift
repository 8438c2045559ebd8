import FCM
import Postgres
import Worker

/// The built-in `store` handler: keeps every upstream message in
/// `upstream_messages(message_id, from_token, category, data, received_at)`.
///
/// A batch is written with one `COPY` (`BatchContext.copy`), PostgreSQL's bulk path: it
/// cost the server 14–20 % less per stored message than a multi-row INSERT (docs/performance.md:
/// most of what is left is the table's three indexes), and goes in the batch's
/// one simple query with its BEGIN, check and COMMIT. It is also the example to copy for
/// a handler of your own.
///
/// Like a plain INSERT (and unlike `ON CONFLICT DO NOTHING`) COPY checks nothing before
/// each row. A stored row means the message was handled: the worker reads this table as
/// a de-duplication record too (see `RecordsUpstreamMessages`), so when `store` is the
/// only handler it writes no other record, and a batch that meets a stored row fails with
/// a unique violation, after which the worker tells the redeliveries apart. The single-message statement skips a row that
/// exists (say one written outside the worker).
public struct StoreHandler: RecordsUpstreamMessages {
    public init() {}

    public var deduplicationRecord: DeduplicationRecord { DeduplicationRecord(table: "upstream_messages", keyColumn: "message_id") }

    /// Refuses data that `jsonb` cannot hold (`\u0000`, numbers beyond `numeric`).
    public func check(_ message: UpstreamMessage) throws {
        if let refusal = PostgresJSONB.refusal(of: message.dataJSON) {
            throw PermanentFailure("data cannot be stored as jsonb: it holds \(refusal)")
        }
    }

    public func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {
        context.execute("""
            INSERT INTO upstream_messages (message_id, from_token, category, data, received_at)
            VALUES ($1, $2, $3, $4::jsonb, $5) ON CONFLICT (message_id) DO NOTHING
            """, [.text(message.messageID), .text(message.from), message.category.map { .text($0) } ?? .null,
                  .jsonb(message.dataJSON), .timestamptz(message.receivedAt)])
    }

    public func handle(batch messages: [UpstreamMessage], in context: BatchContext) async throws {
        var values: [PostgresValue] = []
        values.reserveCapacity(messages.count * 5)
        // One list of values for the whole batch, row after row: no list per message.
        for message in messages {
            values.append(.text(message.messageID))
            values.append(.text(message.from))
            values.append(message.category.map { .text($0) } ?? .null)
            values.append(.jsonb(message.dataJSON))
            values.append(.timestamptz(message.receivedAt))
        }
        context.copy(into: "upstream_messages", columns: ["message_id", "from_token", "category", "data", "received_at"], values: values)
    }
}
