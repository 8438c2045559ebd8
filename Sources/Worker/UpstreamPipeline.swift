import FCM
import Foundation
import Postgres
import Synchronization
import Runtime

/// How the upstream pipeline batches, parallelises and retries.
public struct PipelineSettings: Sendable {
    /// Independent lanes; a device's messages always take the same lane, so they are
    /// handled in arrival order while different devices proceed in parallel.
    public var partitions = 4
    /// Messages waiting per lane before submitters (the connections) wait.
    public var queueCapacity = 2048
    /// Most messages committed in one transaction.
    public var batchSize = 1000
    /// How long a lane holding fewer than `lingerBelow` messages waits for more before it
    /// commits them: at moderate load this turns many tiny transactions (each costing
    /// PostgreSQL a commit and two round trips) into fewer larger ones. Zero commits at once.
    public var batchLinger: Duration = .milliseconds(2)
    /// The batch size from which a lane commits without lingering.
    public var lingerBelow = 64
    /// Handling attempts before a failing message is dead-lettered.
    public var maxAttempts = 5
    /// First retry delay of a failing message (doubling, with jitter, up to `retryCap`).
    public var retryBase: Duration = .seconds(1)
    public var retryCap: Duration = .seconds(60)
    /// First wait while the database is unreachable (doubling up to `databaseRetryCap`).
    public var databaseRetryBase: Duration = .milliseconds(250)
    public var databaseRetryCap: Duration = .seconds(10)

    public init() {}
}

/// Takes upstream work from the connections, commits it in batches (one transaction per
/// batch: de-duplication records, dead letters and every handler's writes), and retries
/// what fails. Nothing submitted is dropped: after `abandon()` what was not committed
/// comes back from `run()` for the spool.
final class UpstreamPipeline: Sendable {
    private final class Lane: Sendable {
        let index: Int
        let queue: BoundedQueue<UpstreamWork>
        let retries = Mutex<[UpstreamWork]>([])

        init(index: Int, capacity: Int) {
            self.index = index
            self.queue = BoundedQueue(capacity: capacity)
        }

        func takeDueRetries(now: ContinuousClock.Instant, maximum: Int) -> [UpstreamWork] {
            retries.withLock { retries in
                var due: [UpstreamWork] = []
                retries.removeAll { work in
                    guard due.count < maximum, let at = work.retryAt, at <= now else { return false }
                    due.append(work)
                    return true
                }
                return due
            }
        }

        var earliestRetry: ContinuousClock.Instant? { retries.withLock { $0.compactMap(\.retryAt).min() } }
        var hasRetries: Bool { retries.withLock { !$0.isEmpty } }
    }

    let pool: PostgresPool
    let handlers: UpstreamHandlers
    let settings: PipelineSettings
    let logger: Logger
    let observer: WorkerObserver?
    private let lanes: [Lane]
    private let abandoned = Atomic(false)

    init(pool: PostgresPool, handlers: UpstreamHandlers, settings: PipelineSettings, logger: Logger, observer: WorkerObserver?) {
        self.pool = pool
        self.handlers = handlers
        self.settings = settings
        self.logger = logger
        self.observer = observer
        self.lanes = (0..<max(1, settings.partitions)).map { Lane(index: $0, capacity: settings.queueCapacity) }
    }

    /// Queues each piece of `work` on its device's lane, in order, waiting while a lane is full.
    func submit(_ work: [UpstreamWork]) async {
        guard lanes.count > 1 else { return await lanes[0].queue.push(contentsOf: work) }
        var byLane = [[UpstreamWork]](repeating: [], count: lanes.count)
        for item in work { byLane[lane(for: item.orderingKey)].append(item) }
        for (index, items) in byLane.enumerated() where !items.isEmpty {
            await lanes[index].queue.push(contentsOf: items)
        }
    }

    /// Work queued or waiting for a retry, across lanes.
    var backlog: Int { lanes.reduce(0) { $0 + $1.queue.count + $1.retries.withLock { $0.count } } }

    /// Processes until `close()` has been called and everything is committed, or until
    /// `abandon()`; returns what was not committed (empty unless abandoned).
    func run() async -> [UpstreamWork] {
        await withTaskGroup(of: [UpstreamWork].self) { group in
            for lane in lanes { group.addTask { await self.run(lane) } }
            var leftovers: [UpstreamWork] = []
            for await rest in group { leftovers += rest }
            return leftovers
        }
    }

    /// No more work will be submitted: `run()` returns once what is queued is done.
    func close() {
        for lane in lanes { lane.queue.close() }
    }

    /// Stop as soon as possible: `run()` returns the uncommitted work.
    func abandon() {
        abandoned.store(true, ordering: .releasing)
        for lane in lanes {
            lane.queue.close()
            lane.queue.poke()
        }
    }

    private var isAbandoned: Bool { abandoned.load(ordering: .acquiring) }

    private func lane(for key: String) -> Int {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325  // FNV-1a: stable across runs
        for byte in key.utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        return Int(hash % UInt64(lanes.count))
    }

    private func run(_ lane: Lane) async -> [UpstreamWork] {
        while true {
            if isAbandoned { return await remaining(lane) }
            // Messages that failed before are retried alone: putting them in a batch would
            // only make it fail again.
            let due = lane.takeDueRetries(now: .now, maximum: settings.batchSize)
            for (index, retry) in due.enumerated() {
                if let leftovers = await process([retry], in: lane) {
                    lane.retries.withLock { $0.append(contentsOf: due[(index + 1)...]) }
                    return leftovers + (await remaining(lane))
                }
            }
            // Wait for new work, waking for the next retry.
            var batch = await lane.queue.take(maximum: settings.batchSize, deadline: due.isEmpty ? lane.earliestRetry : .now)
            if !batch.isEmpty && batch.count < settings.lingerBelow && settings.batchLinger > .zero && !lane.queue.isClosed {
                // One sleep, then whatever came meanwhile: cheaper than waking per arrival.
                try? await Task.sleep(for: settings.batchLinger)
                batch += await lane.queue.take(maximum: settings.batchSize - batch.count, deadline: .now)
            }
            if batch.isEmpty {
                if isAbandoned { return await remaining(lane) }
                if !due.isEmpty { continue }
                if lane.queue.isClosed && lane.queue.count == 0 {
                    guard let next = lane.earliestRetry else { return [] }
                    // Closed: `take` no longer waits, so wait here for the retry (or abandon).
                    while ContinuousClock.now < next && !isAbandoned {
                        try? await Task.sleep(for: min(.milliseconds(50), next - .now))
                    }
                }
                continue
            }
            if let leftovers = await process(batch, in: lane) {
                return leftovers + (await remaining(lane))
            }
        }
    }

    private func remaining(_ lane: Lane) async -> [UpstreamWork] {
        var rest = lane.retries.withLock { retries in defer { retries.removeAll() }; return retries }
        while true {
            let more = await lane.queue.take(maximum: 10_000, deadline: .now)
            if more.isEmpty { break }
            rest += more
        }
        return rest
    }

    /// Commits `batch`; on a handler or statement failure isolates each piece. Returns the
    /// batch back only when abandoned while the database was unreachable.
    private func process(_ batch: [UpstreamWork], in lane: Lane) async -> [UpstreamWork]? {
        var delay = settings.databaseRetryBase
        while true {
            do {
                try await pool.withConnection { connection in try await self.commit(batch, on: connection) }
                await acknowledge(batch)
                return nil
            } catch let error as PostgresError where error.kind == .connection {
                logger.warning("database unavailable (\(error.message)); \(batch.count) message(s) wait, retrying in \(delay.formattedSeconds)")
                observer?(.databaseUnavailable(error.message))
                let until = ContinuousClock.now + delay
                while ContinuousClock.now < until {
                    if isAbandoned { return batch }
                    try? await Task.sleep(for: min(.milliseconds(50), until - .now))
                }
                delay = min(delay * 2, settings.databaseRetryCap)
            } catch {
                guard batch.count > 1 else {
                    if let leftover = await failed(batch[0], error: error, in: lane) { return leftover }
                    return nil
                }
                logger.info("a batch of \(batch.count) failed (\(error)); handling its messages one by one")
                for (index, work) in batch.enumerated() {
                    if let leftovers = await process([work], in: lane) {
                        return leftovers + batch[(index + 1)...]
                    }
                }
                return nil
            }
        }
    }

    /// A single message failed: retry it later, or dead-letter it after the last attempt.
    private func failed(_ work: UpstreamWork, error: any Error, in lane: Lane) async -> [UpstreamWork]? {
        var work = work
        work.attempts += 1
        guard case .message(let message) = work.kind else {
            logger.error("could not store a dead letter: \(error)")
            work.retryAt = .now + settings.retryBase
            lane.retries.withLock { $0.append(work) }
            return nil
        }
        let description = String(describing: error)
        if work.attempts >= settings.maxAttempts {
            logger.error("message \(message.messageID) failed \(work.attempts) times, dead-lettered: \(description)")
            var letter = work
            letter.kind = .deadLetter(.init(messageID: message.messageID, from: message.from, category: message.category,
                                            rawPayload: message.rawPayload, reason: "handler_failed", error: description,
                                            attempts: work.attempts, receivedAt: message.receivedAt))
            return await process([letter], in: lane)
        }
        let ceiling = min(settings.retryCap, settings.retryBase * (1 << min(work.attempts - 1, 20)))
        let delay = ceiling * Double.random(in: 0.5...1.0)
        work.retryAt = .now + delay
        lane.retries.withLock { $0.append(work) }
        lane.queue.poke()
        logger.warning("message \(message.messageID) failed (attempt \(work.attempts) of \(settings.maxAttempts)), retrying in \(delay.formattedSeconds): \(description)")
        observer?(.retryScheduled(messageID: message.messageID, attempt: work.attempts, delay: delay))
        return nil
    }

    /// One transaction: de-duplication records, dead letters, then the handlers of the
    /// messages not seen before, then COMMIT.
    ///
    /// A message was seen before when its id is in `processed_upstream` or, stored by the
    /// `store` handler, in `upstream_messages`. When `store` is the only handler its row is
    /// the record, and the whole batch goes in one round trip; otherwise the ids are
    /// recorded in `processed_upstream` before any handler runs.
    private func commit(_ batch: [UpstreamWork], on connection: PostgresConnection) async throws {
        var messages: [UpstreamMessage] = []
        var letters: [UpstreamWork.DeadLetter] = []
        var seen = Set<String>()
        var ids: [PostgresValue] = [], deadLettered: [PostgresValue] = []
        for work in batch {
            switch work.kind {
            case .message(let message):
                guard seen.insert(message.messageID).inserted else { continue }
                messages.append(message)
                ids.append(.text(message.messageID))
            case .deadLetter(let letter):
                letters.append(letter)
                if letter.reason == "handler_failed", let id = letter.messageID, seen.insert(id).inserted {
                    ids.append(.text(id))
                    deadLettered.append(.text(id))
                }
            }
        }
        let arrivals = batch.count { if case .message = $0.kind { true } else { false } }
        let transaction = UpstreamTransaction(connection: connection)
        do {
            let firstSeen: Set<String>?
            if handlers.storedRowsRecordEveryMessage && deadLettered.isEmpty {
                do {
                    // One round trip: the check, the stored rows (the records), COMMIT. A
                    // redelivery fails it with a unique violation before anything commits.
                    transaction.enqueue(PostgresStatement("BEGIN"))
                    transaction.enqueue(PostgresStatement(Self.failIfProcessed, [.array(ids)]))
                    try await handle(messages, letters: letters, in: transaction, batchingSingles: true)
                    transaction.enqueue(PostgresStatement("COMMIT"))
                    try await transaction.flush()
                    observer?(.committed(handled: messages.map { ($0.messageID, $0.receivedAt) },
                                         duplicates: arrivals - messages.count, deadLettered: letters.map { $0.messageID ?? "" }))
                    return
                } catch let error as PostgresError where error.isUniqueViolation {
                    _ = try await connection.execute("ROLLBACK")
                    transaction.discard()
                }
                firstSeen = try await openRecordingCarefully(ids, deadLettered: deadLettered, on: connection)
            } else {
                firstSeen = try await openAndRecord(ids, deadLettered: deadLettered, on: connection)
            }
            let fresh = { (id: String) in firstSeen?.contains(id) ?? true }
            let newMessages = messages.filter { fresh($0.messageID) }
            let written = letters.filter { $0.reason != "handler_failed" || $0.messageID.map(fresh) == true }
            try await handle(newMessages, letters: written, in: transaction, batchingSingles: false)
            transaction.enqueue(PostgresStatement("COMMIT"))
            try await transaction.flush()
            observer?(.committed(handled: newMessages.map { ($0.messageID, $0.receivedAt) },
                                 duplicates: arrivals - newMessages.count, deadLettered: written.map { $0.messageID ?? "" }))
        } catch {
            _ = try? await connection.execute("ROLLBACK")
            throw error
        }
    }

    /// Raises a unique violation when any of the ids ($1) is in `processed_upstream`
    /// (dead-lettered, or handled while other handlers were configured); otherwise it only
    /// looks them up and inserts nothing.
    private static let failIfProcessed = """
        INSERT INTO processed_upstream (message_id)
        SELECT message_id FROM processed_upstream WHERE message_id = ANY($1::text[])
        """

    /// Whether any of the ids ($1) was stored by the `store` handler, which makes it handled.
    private static let anyStored = "SELECT EXISTS (SELECT 1 FROM upstream_messages WHERE message_id = ANY($1::text[]))"

    /// Queues the dead letters and runs every matching handler on `messages`. With
    /// `batchingSingles`, a batch handler gets even a single message as a batch (the
    /// `store` handler's batch statement is the one that fails on a stored row).
    private func handle(_ messages: [UpstreamMessage], letters: [UpstreamWork.DeadLetter],
                        in transaction: UpstreamTransaction, batchingSingles: Bool) async throws {
        for letter in letters {
            transaction.enqueue(PostgresStatement("""
                INSERT INTO dead_letters (message_id, from_token, category, raw_payload, reason, error, attempts, received_at)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                """, [letter.messageID.map { .text($0) } ?? .null, letter.from.map { .text($0) } ?? .null,
                      letter.category.map { .text($0) } ?? .null, .text(letter.rawPayload), .text(letter.reason),
                      letter.error.map { .text($0) } ?? .null, .int(Int64(letter.attempts)), .timestamptz(letter.receivedAt)]))
        }
        for route in handlers.routes {
            let matching = messages.filter { route.match.matches($0) }
            guard !matching.isEmpty else { continue }
            let handlerLogger = logger.labeled("handler \(route.name)")
            if let batchHandler = route.handler as? any BatchUpstreamHandler, matching.count > 1 || batchingSingles {
                try await batchHandler.handle(batch: matching, in: BatchContext(logger: handlerLogger, transaction: transaction))
            } else {
                for message in matching {
                    try await route.handler.handle(message, in: HandlerContext(message: message, logger: handlerLogger, transaction: transaction))
                }
            }
        }
    }

    /// Opens the batch's transaction and records its ids in `processed_upstream`. Returns
    /// the ids seen for the first time, or nil when that is all of them (the usual case).
    ///
    /// The record is first tried as a plain INSERT: `ON CONFLICT DO NOTHING` makes
    /// PostgreSQL check each id before inserting and log one more WAL record per row, about
    /// 2 µs a row. Only when an id was recorded before (a redelivery) does the plain INSERT
    /// fail with a unique violation, or find the id stored; then the transaction is opened
    /// again and the ids are told apart carefully.
    private func openAndRecord(_ ids: [PostgresValue], deadLettered: [PostgresValue],
                               on connection: PostgresConnection) async throws -> Set<String>? {
        do {
            let opening = try await connection.pipeline([
                PostgresStatement("BEGIN"),
                PostgresStatement("""
                    INSERT INTO processed_upstream (message_id, outcome)
                    SELECT id, \(Self.outcome) FROM unnest($1::text[]) AS id
                    """, [.array(ids), .array(deadLettered)]),
                PostgresStatement(Self.anyStored, [.array(ids)]),
            ])
            if opening[2].rows.first?.bool(0) != true { return nil }
        } catch let error as PostgresError where error.isUniqueViolation {}
        _ = try await connection.execute("ROLLBACK")
        return try await openRecordingCarefully(ids, deadLettered: deadLettered, on: connection)
    }

    /// `processed_upstream.outcome` of id: `dead_lettered` for those in $2.
    private static let outcome = "CASE WHEN id = ANY($2::text[]) THEN 'dead_lettered' ELSE 'handled' END"

    /// Opens the batch's transaction, records its ids in `processed_upstream` where they are
    /// not yet, and returns those seen for the first time (not recorded, not stored), or nil
    /// when that is all of them.
    private func openRecordingCarefully(_ ids: [PostgresValue], deadLettered: [PostgresValue],
                                        on connection: PostgresConnection) async throws -> Set<String>? {
        let opening = try await connection.pipeline([
            PostgresStatement("BEGIN"),
            PostgresStatement("""
                WITH recorded AS (
                    INSERT INTO processed_upstream (message_id, outcome)
                    SELECT id, \(Self.outcome) FROM unnest($1::text[]) AS id
                    ON CONFLICT DO NOTHING RETURNING message_id
                )
                SELECT array_agg(message_id) FROM recorded
                """, [.array(ids), .array(deadLettered)]),
            PostgresStatement("SELECT array_agg(message_id) FROM upstream_messages WHERE message_id = ANY($1::text[])",
                              [.array(ids)]),
        ])
        let recorded = Set(opening[1].rows.first?.strings(0) ?? [])
        let stored = Set(opening[2].rows.first?.strings(0) ?? [])
        let firstSeen = recorded.subtracting(stored)
        return firstSeen.count == ids.count ? nil : firstSeen
    }

    /// Sends the durable-mode acks of a committed batch, one write per connection.
    private func acknowledge(_ batch: [UpstreamWork]) async {
        var routes: [ObjectIdentifier: [AckRoute.Pending]] = [:]
        var order: [AckRoute] = []
        for work in batch {
            guard let ack = work.ack else { continue }
            let key = ObjectIdentifier(ack.route)
            if routes[key] == nil { order.append(ack.route) }
            routes[key, default: []].append(ack)
        }
        for route in order { await route.send(routes[ObjectIdentifier(route)] ?? []) }
    }
}
