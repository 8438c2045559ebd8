import FCM
import Postgres

/// A JSON value as a `jsonb` parameter (`$1::jsonb`).
extension JSONValue: PostgresValueConvertible {
    public var postgresValue: PostgresValue { .jsonb(serialized) }
}
