// `import Worker` is all a handler module needs: the message and value types
// (`JSONValue`, `DownstreamValidationError`, … from FCM), the database types
// (`PostgresValue`, `PostgresRow`, … from Postgres) and `Logger` (from Runtime).
@_exported import FCM
@_exported import Postgres
@_exported import Runtime
