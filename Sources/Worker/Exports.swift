// `import Worker` is all a handler module needs: the message and value types
// (`JSONValue`, `DownstreamValidationError`, … from FCM), the database types
// (`PostgresValue`, `PostgresRow`, … from Postgres) and `Logger` (from Runtime). Of Runtime
// only `Logger` is exported: its locks, queues and threads are the worker's own business,
// not a handler module's.
@_exported import FCM
@_exported import Postgres
@_exported import struct Runtime.Logger
