internal import CLibPQ
internal import COpenSSL
import Foundation
import Runtime
#if canImport(Glibc)
import Glibc
#endif

/// Owns one `PGconn`, in non-blocking mode, and is touched only on its connection's thread
/// (`interrupt()` and the flags excepted).
///
/// Every wait for the server (connecting, sending, reading results) polls the socket
/// together with a wake pipe, until a deadline: when the deadline passes, or `interrupt()`
/// is called (its task was cancelled), the call gives up, the connection is marked broken
/// (the pool replaces it), and the server is asked to cancel what it runs (`PQcancel`, on
/// a thread of its own: it opens a connection of its own, which may hang as well).
/// `@unchecked Sendable`: the `PGconn` is used by one call at a time (the pool lends the
/// handle to one caller, whose call runs on a dedicated thread); what other threads touch
/// (`interrupt()`, the health flags) is atomic or the wake pipe.
final class ConnectionHandle: @unchecked Sendable {
    private var connection: OpaquePointer?
    private let healthy = AtomicFlag(true)
    private let interrupted = AtomicFlag(false)
    /// False while a transaction is open (or aborted) on the server, as of the last call.
    private let outsideTransaction = AtomicFlag(true)
    /// The error that showed the server does not keep this connection's prepared
    /// statements (a transaction pooler), once seen. Read from any thread.
    let preparedStatementsNotKept = BlockingLock<PostgresError?>(nil)
    private let lostPreparedStatements = AtomicFlag(false)
    /// Ends a wait for the server early (`interrupt()`).
    private let wakePipe: WakePipe
    /// Redacts the password of this connection from messages.
    private let target: PostgresConnectionString
    /// The statements prepared on this connection, by SQL text.
    private var prepared: PreparedStatementNames
    /// True while a statement was sent and its results are not all read.
    private var statementInFlight = false

    /// TCP settings used unless the connection string sets them: a silent server is found
    /// by keepalives after about a minute of idleness, and unacknowledged data gives up
    /// after 30 s (`tcp_user_timeout`, milliseconds).
    static let networkDefaults = [
        ("keepalives", "1"), ("keepalives_idle", "30"), ("keepalives_interval", "10"), ("keepalives_count", "3"),
        ("tcp_user_timeout", "30000"),
    ]

    /// A handle that is not connected yet (see `connect`): `interrupt()` works from now on.
    init(target: PostgresConnectionString, preparedLimit: Int) throws(PostgresError) {
        self.target = target
        prepared = PreparedStatementNames(limit: preparedLimit)
        do { wakePipe = try WakePipe() } catch { throw PostgresError(kind: .connection, message: "\(error)") }
    }

    /// Connects before `deadline` (blocking this thread; `interrupt()` ends it early).
    func connect(deadline: ContinuousClock.Instant) throws(PostgresError) {
        // Before libpq's first use of OpenSSL (its first SSL request, `sslmode=prefer` by default).
        shim_initialize_openssl_for_process()
        let parameters = target.adding(Self.networkDefaults)
        let keywords = parameters.map { strdup($0.keyword) } + [nil]
        let values = parameters.map { strdup($0.value) } + [nil]
        defer { (keywords + values).forEach { free($0) } }
        connection = keywords.map { UnsafePointer($0) }.withUnsafeBufferPointer { keywordPointers in
            values.map { UnsafePointer($0) }.withUnsafeBufferPointer { valuePointers in
                PQconnectStartParams(keywordPointers.baseAddress, valuePointers.baseAddress, 0)
            }
        }
        guard let connection else {
            throw PostgresError(kind: .connection, message: "libpq could not allocate a connection")
        }
        if PQstatus(connection) == CONNECTION_BAD {
            // Refused before any network work: an option libpq cannot use ("invalid sslmode
            // value") is a configuration error, never retried; anything else is retried.
            let message = target.redact(String(cString: PQerrorMessage(connection)))
            finish()
            throw PostgresError(kind: message.hasPrefix("invalid ") ? .configuration : .connection, message: message)
        }
        do throws(PostgresError) {
            try completeConnection(connection, deadline: deadline)
            guard PQsetnonblocking(connection, 1) == 0 else { throw connectionError("cannot enter non-blocking mode") }
            PQsetNoticeReceiver(connection, Self.receiveNotice, nil)
            try simpleQuery("SET TimeZone = 'UTC'; SET DateStyle = 'ISO'", deadline: deadline)
        } catch {
            finish()
            throw error
        }
    }

    deinit {
        finish()
    }

    var isHealthy: Bool { healthy.value && !interrupted.value && !lostPreparedStatements.value }
    var isOutsideTransaction: Bool { outsideTransaction.value }

    /// Makes the call under way (or the next one) give up at once; the connection is
    /// broken from then on. Safe from any thread.
    func interrupt() {
        interrupted.value = true
        wakePipe.wake()
    }

    // MARK: - Calls (this connection's thread only)

    func execute(_ statement: PostgresStatement, deadline: ContinuousClock.Instant?) throws(PostgresError) -> PostgresResult {
        if statement.copyData != nil {
            return try pipeline([statement], deadline: deadline).first ?? PostgresResult(rows: [], affectedRows: 0)
        }
        let connection = try live()
        let encoded = try EncodedStatement(statement, index: 0)
        statementInFlight = true
        defer { statementInFlight = false; noteTransactionStatus() }
        // Statements with parameters are prepared on first use, as in `pipeline`.
        var name = prepared.names[statement.sql]
        if name == nil, let candidate = prepared.newName(for: statement) {
            guard PQsendPrepare(connection, candidate, statement.sql, Int32(statement.parameters.count), nil) == 1 else {
                throw connectionError("sending a preparation failed")
            }
            try flush(deadline)
            _ = try results(for: 0, deadline: deadline, byName: true)
            prepared.names[statement.sql] = candidate
            name = candidate
        }
        let values = encoded.values
        let sent = name.map { PQsendQueryPrepared(connection, $0, Int32(values.count), values, nil, nil, 0) }
            ?? PQsendQueryParams(connection, statement.sql, Int32(values.count), nil, values, nil, nil, 0)
        guard sent == 1 else { throw connectionError("sending a statement failed") }
        try flush(deadline)
        do {
            return try results(for: 0, deadline: deadline, byName: name != nil) ?? PostgresResult(rows: [], affectedRows: 0)
        } catch {
            prepared.forgetIfStale(statement.sql, after: error)
            throw error
        }
    }

    /// Runs SQL text that may hold several statements and no parameters.
    func simpleQuery(_ sql: String, deadline: ContinuousClock.Instant?) throws(PostgresError) {
        let connection = try live()
        try EncodedStatement.refuseNul(in: sql, what: "the SQL text", index: 0)
        statementInFlight = true
        defer { statementInFlight = false; noteTransactionStatus() }
        guard PQsendQuery(connection, sql) == 1 else { throw connectionError("sending a query failed") }
        try flush(deadline)
        _ = try results(for: 0, deadline: deadline, byName: false)
    }

    func pipeline(_ statements: [PostgresStatement], deadline: ContinuousClock.Instant?) throws(PostgresError) -> [PostgresResult] {
        guard statements.contains(where: { $0.copyData != nil }) else {
            return try pipelined(statements, numbered: Array(statements.indices), deadline: deadline)
        }
        // COPY cannot run in pipeline mode: each runs in a simple query with the statements
        // without parameters around it; the others run pipelined between them.
        var results: [PostgresResult] = []
        results.reserveCapacity(statements.count)
        for group in PipelineGroup.split(statements) {
            switch group {
            case .pipelined(let indices):
                results += try pipelined(indices.map { statements[$0] }, numbered: indices, deadline: deadline)
            case .simple(let indices):
                results += try simpleWithCopies(indices.map { statements[$0] }, numbered: indices, deadline: deadline)
            }
        }
        return results
    }

    /// Runs `statements` (parameterless ones and COPYs) as one simple query, sending each
    /// COPY's rows when the server asks for them. `numbers`: their indexes in the caller's list.
    private func simpleWithCopies(_ statements: [PostgresStatement], numbered numbers: [Int],
                                  deadline: ContinuousClock.Instant?) throws(PostgresError) -> [PostgresResult] {
        let connection = try live()
        statementInFlight = true
        defer { statementInFlight = false; noteTransactionStatus() }
        // One result per statement: a statement's own trailing semicolon would add an empty one.
        let sql = statements.map { statement in
            var text = Substring(statement.sql)
            while let last = text.last, last == ";" || last.isWhitespace { text = text.dropLast() }
            return String(text)
        }.joined(separator: ";\n")
        for (statement, number) in zip(statements, numbers) {
            try EncodedStatement.refuseNul(in: statement.sql, what: "the SQL text", index: number)
            if let problem = statement.copyData?.problem {
                throw PostgresError(kind: .statement, message: "\(problem): not sent", statementIndex: number)
            }
        }
        guard PQsendQuery(connection, sql) == 1 else { throw connectionError("sending a query failed") }
        try flush(deadline)
        var results: [PostgresResult] = []
        var firstError: PostgresError?
        var position = 0
        while let result = try nextResult(deadline) {
            defer { PQclear(result) }
            let status = PQresultStatus(result)
            let index = min(position, statements.count - 1)
            if status == PGRES_COPY_IN {
                // The server waits for this COPY's rows (its completion is the next result).
                do {
                    try sendCopyData(statements[index].copyData ?? .rows([]), deadline: deadline)
                } catch {
                    // Stuck in the middle of a COPY: nothing else can use this connection.
                    healthy.value = false
                    throw error
                }
                continue
            }
            position += 1
            do {
                results.append(try decodeStatus(status, of: result, statement: numbers[index], byName: false))
            } catch {
                if firstError == nil { firstError = error }
            }
        }
        if let firstError { throw firstError }
        return results
    }

    /// Sends a COPY's rows in the text format, then its end; waits for the socket when
    /// libpq's buffer is full.
    private func sendCopyData(_ data: PostgresCopyData, deadline: ContinuousClock.Instant?) throws(PostgresError) {
        let connection = try live()
        var chunk: [UInt8] = []
        chunk.reserveCapacity(64 << 10)
        func send(_ pending: inout [UInt8]) throws(PostgresError) {
            guard !pending.isEmpty else { return }
            while true {
                let sent = pending.withUnsafeBufferPointer { bytes in
                    bytes.withMemoryRebound(to: CChar.self) { PQputCopyData(connection, $0.baseAddress, Int32($0.count)) }
                }
                if sent == 1 { break }
                if sent < 0 { throw connectionError("sending COPY data failed") }
                try flush(deadline)
            }
            pending.removeAll(keepingCapacity: true)
        }
        try data.encode(to: &chunk, chunkBytes: 64 << 10, send)
        try send(&chunk)
        while true {
            let ended = PQputCopyEnd(connection, nil)
            if ended == 1 { break }
            if ended < 0 { throw connectionError("ending COPY data failed") }
            try flush(deadline)
        }
        try flush(deadline)
    }

    /// Runs `statements` in one pipeline; `numbers` are their indexes in the caller's list
    /// (for errors).
    private func pipelined(_ statements: [PostgresStatement], numbered numbers: [Int],
                           deadline: ContinuousClock.Instant?) throws(PostgresError) -> [PostgresResult] {
        let connection = try live()
        guard !statements.isEmpty else { return [] }
        // Every value is encoded (and checked) before anything is sent.
        var encoded: [EncodedStatement] = []
        encoded.reserveCapacity(statements.count)
        for (statement, number) in zip(statements, numbers) { encoded.append(try EncodedStatement(statement, index: number)) }
        guard PQenterPipelineMode(connection) == 1 else { throw connectionError("cannot enter pipeline mode") }
        statementInFlight = true
        defer {
            statementInFlight = false
            if self.connection != nil { PQexitPipelineMode(connection) }
            noteTransactionStatus()
        }
        // Statements with parameters run as prepared statements, prepared on first use in
        // the same pipeline: the server then parses each once per connection (and, once
        // its generic plan proves as good, plans it once too).
        var preparing: [Int: String] = [:]
        var preparingNames: [String: String] = [:]
        // The statements sent by a prepared name (their errors can say the pooler lost it).
        var byName = [Bool](repeating: true, count: statements.count)
        for (index, statement) in statements.enumerated() {
            let sent: Int32
            let values = encoded[index].values
            if let name = prepared.names[statement.sql] ?? preparingNames[statement.sql] {
                sent = PQsendQueryPrepared(connection, name, Int32(values.count), values, nil, nil, 0)
            } else if let name = prepared.newName(for: statement, pending: preparing.count) {
                preparingNames[statement.sql] = name
                guard PQsendPrepare(connection, name, statement.sql, Int32(statement.parameters.count), nil) == 1 else {
                    throw connectionError("sending a pipelined statement failed")
                }
                preparing[index] = name
                sent = PQsendQueryPrepared(connection, name, Int32(values.count), values, nil, nil, 0)
            } else {
                byName[index] = false
                sent = PQsendQueryParams(connection, statement.sql, Int32(values.count), nil, values, nil, nil, 0)
            }
            guard sent == 1 else { throw connectionError("sending a pipelined statement failed") }
        }
        guard PQpipelineSync(connection) == 1 else { throw connectionError("pipeline sync failed") }
        try flush(deadline)
        var results: [PostgresResult] = []
        results.reserveCapacity(statements.count)
        var firstError: PostgresError?
        // Each statement's results end with a NULL (a preparation's come first, ending the
        // same way); then comes the sync marker.
        for index in statements.indices {
            if let name = preparing[index] {
                var isPrepared = false
                while let result = try nextResult(deadline) {
                    defer { PQclear(result) }
                    if PQresultStatus(result) == PGRES_COMMAND_OK {
                        isPrepared = true
                    } else if PQresultStatus(result) != PGRES_PIPELINE_ABORTED {
                        do { _ = try decode(result, statement: numbers[index], byName: true) } catch {
                            if firstError == nil { firstError = error }
                        }
                    }
                }
                if isPrepared { prepared.names[statements[index].sql] = name }
            }
            var outcome: PostgresResult?
            while let result = try nextResult(deadline) {
                defer { PQclear(result) }
                if PQresultStatus(result) == PGRES_PIPELINE_ABORTED { continue }
                do {
                    outcome = try decode(result, statement: numbers[index], byName: byName[index])
                } catch {
                    prepared.forgetIfStale(statements[index].sql, after: error)
                    if firstError == nil { firstError = error }
                }
            }
            if let outcome { results.append(outcome) }
            if PQstatus(connection) != CONNECTION_OK { break }
        }
        while let result = try nextResult(deadline) {
            let status = PQresultStatus(result)
            PQclear(result)
            if status == PGRES_PIPELINE_SYNC { break }
        }
        if PQstatus(connection) != CONNECTION_OK {
            healthy.value = false
            throw firstError ?? connectionError("the connection broke during a pipeline")
        }
        if let firstError { throw firstError }
        return results
    }

    /// Waits up to `timeout` for a notification on a channel this connection listens to.
    func nextNotification(timeout: Duration) throws(PostgresError) -> PostgresNotification? {
        let connection = try live()
        let deadline = ContinuousClock.now + timeout
        while true {
            guard PQconsumeInput(connection) == 1 else { throw connectionError("reading notifications failed") }
            if let notification = PQnotifies(connection) {
                defer { PQfreemem(notification) }
                return PostgresNotification(channel: String(cString: notification.pointee.relname),
                                            payload: String(cString: notification.pointee.extra))
            }
            if try wait(for: Int16(POLLIN), until: deadline, meaning: .waitEnded) == nil { return nil }
        }
    }

    func finish() {
        if let connection { PQfinish(connection) }
        connection = nil
        healthy.value = false
    }

    // MARK: - Waiting for the server

    /// Sends what libpq has buffered, reading meanwhile so that the server never blocks on us.
    private func flush(_ deadline: ContinuousClock.Instant?) throws(PostgresError) {
        let connection = try live()
        while true {
            let status = PQflush(connection)
            if status == 0 { return }
            if status < 0 { throw connectionError("sending to the server failed") }
            let ready = try wait(for: Int16(POLLIN | POLLOUT), until: deadline) ?? 0
            if ready & Int16(POLLIN) != 0, PQconsumeInput(connection) != 1 { throw connectionError("reading from the server failed") }
        }
    }

    /// The next result (nil at the end of a statement's results), waiting for it without
    /// blocking past the deadline.
    private func nextResult(_ deadline: ContinuousClock.Instant?) throws(PostgresError) -> OpaquePointer? {
        let connection = try live()
        while PQisBusy(connection) == 1 {
            try wait(for: Int16(POLLIN), until: deadline)
            guard PQconsumeInput(connection) == 1 else { throw connectionError("reading from the server failed") }
        }
        return PQgetResult(connection)
    }

    /// Every result of the statement sent last; the last one decoded (errors thrown).
    private func results(for index: Int, deadline: ContinuousClock.Instant?, byName: Bool) throws(PostgresError) -> PostgresResult? {
        var outcome: PostgresResult?
        var firstError: PostgresError?
        while let result = try nextResult(deadline) {
            defer { PQclear(result) }
            do {
                outcome = try decode(result, statement: index, byName: byName)
            } catch {
                if firstError == nil { firstError = error }
            }
        }
        if let firstError { throw firstError }
        return outcome
    }

    /// What a deadline means to a wait.
    private enum DeadlineMeaning { case callTimedOut, waitEnded }

    /// Polls the socket for `events` and the wake pipe until `deadline`; returns the
    /// socket's events, or nil when a `waitEnded` deadline passed. Past a call's deadline,
    /// or once interrupted, the connection is broken: the server is asked to cancel what
    /// it runs and the call fails.
    @discardableResult
    private func wait(for events: Int16, until deadline: ContinuousClock.Instant?,
                      meaning: DeadlineMeaning = .callTimedOut) throws(PostgresError) -> Int16? {
        let connection = try live()
        while true {
            if interrupted.value { throw abandon("the call was cancelled (shutdown)") }
            var timeout: Int32 = -1
            if let deadline {
                let remaining = deadline - .now
                if remaining <= .zero {
                    switch meaning {
                    case .callTimedOut: throw abandon("no answer from PostgreSQL within the database timeout")
                    case .waitEnded: return nil
                    }
                }
                timeout = remaining.pollMilliseconds
            }
            var descriptors = [pollfd(fd: PQsocket(connection), events: events, revents: 0), wakePipe.pollDescriptor]
            let result = poll(&descriptors, 2, timeout)
            if result < 0 && errno != EINTR { throw connectionError("poll failed: \(String(cString: strerror(errno)))") }
            if descriptors[1].revents != 0 { wakePipe.drain() }
            if descriptors[0].revents != 0 { return descriptors[0].revents }
        }
    }

    /// Breaks the connection after a missed deadline or an interruption: the server is
    /// asked to cancel the statement under way on a thread of its own, then the
    /// connection closes.
    private func abandon(_ reason: String) -> PostgresError {
        if statementInFlight, let connection, let cancel = PQgetCancel(connection) {
            let request = CancelRequest(cancel)
            Thread.start(named: "postgres-cancel", stackSize: 256 << 10) { request.send() }
        }
        healthy.value = false
        finish()
        return PostgresError(kind: .connection, message: "\(reason): the connection was dropped and will be replaced")
    }

    /// Drives `PQconnectPoll` to the end before `deadline`.
    private func completeConnection(_ connection: OpaquePointer, deadline: ContinuousClock.Instant) throws(PostgresError) {
        var status = PGRES_POLLING_WRITING
        while true {
            switch status {
            case PGRES_POLLING_OK:
                return
            case PGRES_POLLING_FAILED:
                throw PostgresError(kind: .connection, message: target.redact(String(cString: PQerrorMessage(connection))))
            case PGRES_POLLING_READING, PGRES_POLLING_WRITING:
                let events = status == PGRES_POLLING_READING ? Int16(POLLIN) : Int16(POLLOUT)
                if interrupted.value { throw PostgresError(kind: .connection, message: "connecting was cancelled") }
                let remaining = deadline - .now
                guard remaining > .zero else {
                    throw PostgresError(kind: .connection, message: "connecting timed out (\(target.redact(target["host"] ?? "local socket")))")
                }
                var descriptors = [pollfd(fd: PQsocket(connection), events: events, revents: 0), wakePipe.pollDescriptor]
                if poll(&descriptors, 2, remaining.pollMilliseconds) < 0 && errno != EINTR {
                    throw PostgresError(kind: .connection, message: "poll failed: \(String(cString: strerror(errno)))")
                }
                if descriptors[0].revents == 0 { continue }
            default:
                break
            }
            status = PQconnectPoll(connection)
        }
    }

    // MARK: - Helpers

    private func live() throws(PostgresError) -> OpaquePointer {
        guard let connection, healthy.value else {
            throw PostgresError(kind: .connection, message: "the connection is closed")
        }
        if interrupted.value { throw abandon("the call was cancelled (shutdown)") }
        return connection
    }

    /// Records whether a transaction is open; called after every call that sends SQL.
    private func noteTransactionStatus() {
        guard let connection else { return }
        outsideTransaction.value = PQtransactionStatus(connection) == PQTRANS_IDLE
    }

    private func connectionError(_ what: String) -> PostgresError {
        let detail = connection.map { String(cString: PQerrorMessage($0)) } ?? ""
        if let connection, PQstatus(connection) != CONNECTION_OK { healthy.value = false }
        return PostgresError(kind: .connection, message: target.redact("\(what): \(detail)"))
    }

    /// `byName`: the result is of a statement run by one of this connection's prepared
    /// names, or of its preparation.
    private func decode(_ result: OpaquePointer?, statement index: Int, byName: Bool) throws(PostgresError) -> PostgresResult {
        guard let result else { throw connectionError("no result") }
        return try decodeStatus(PQresultStatus(result), of: result, statement: index, byName: byName)
    }

    private func decodeStatus(_ status: ExecStatusType, of result: OpaquePointer, statement index: Int,
                              byName: Bool) throws(PostgresError) -> PostgresResult {
        switch status {
        case PGRES_TUPLES_OK, PGRES_COMMAND_OK, PGRES_EMPTY_QUERY:
            return PostgresResult(reading: result)
        default:
            let sqlState = PQresultErrorField(result, Int32(UInt8(ascii: "C"))).map { String(cString: $0) }
            let message = target.redact(String(cString: PQresultErrorMessage(result)).trimmingCharacters(in: .whitespacesAndNewlines))
            if let connection, PQstatus(connection) != CONNECTION_OK {
                healthy.value = false
                throw PostgresError(kind: .connection, sqlState: sqlState, message: message)
            }
            // Class 08 is "connection exception"; 57P01-03 are shutdowns.
            if let sqlState, sqlState.hasPrefix("08") || sqlState.hasPrefix("57P") {
                healthy.value = false
                throw PostgresError(kind: .connection, sqlState: sqlState, message: message)
            }
            // The server does not hold what this connection prepared (or holds it already):
            // the names this connection knows are wrong, so it is replaced after this call.
            let notKept = byName && (sqlState == "26000" || sqlState == "42P05")
            let error = PostgresError(kind: .statement, sqlState: sqlState, message: message, statementIndex: index,
                                      preparedStatementNotKept: notKept)
            if notKept {
                // Not `healthy`: the call reads its remaining results first.
                lostPreparedStatements.value = true
                preparedStatementsNotKept.withLock { if $0 == nil { $0 = error } }
            }
            throw error
        }
    }

    /// Server notices: warnings go to standard error as `postgres WARNING: …` on one line;
    /// NOTICE, INFO and DEBUG messages ("relation … already exists, skipping") are dropped
    /// rather than printed raw into the worker's log as libpq would by default.
    private static let receiveNotice: PQnoticeReceiver = { _, result in
        guard let result, let severity = PQresultErrorField(result, Int32(UInt8(ascii: "V"))),
              String(cString: severity) == "WARNING", let message = PQresultErrorMessage(result) else { return }
        FileHandle.standardError.write(Data("postgres \(PostgresConnectionString.redactPatterns(String(cString: message)))\n".utf8))
    }
}
