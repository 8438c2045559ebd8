// `import Worker` is all a handler module needs, and all it sees: besides Worker's own API,
// the value types a handler works with, each named here. JSON (`JSONValue`, `JSONNumber`)
// and `DownstreamValidationError` from FCM, the database's values and rows
// (`PostgresValue`, `PostgresValueConvertible`, `PostgresRow`, `PostgresJSONB`,
// `PostgresError`) from Postgres, and `Logger` from Runtime. The rest of those modules (the
// connections, pools, clients, parsers, locks and threads) is the engine's business: a
// module that needs them imports them itself.
@_exported import Upstream
@_exported import enum FCM.JSONValue
@_exported import struct FCM.JSONNumber
@_exported import struct FCM.DownstreamValidationError
@_exported import enum Postgres.PostgresValue
@_exported import protocol Postgres.PostgresValueConvertible
@_exported import struct Postgres.PostgresRow
@_exported import enum Postgres.PostgresJSONB
@_exported import struct Postgres.PostgresError
@_exported import struct Runtime.Logger
