import FCM
import Foundation
import Postgres
import Runtime
import Synchronization

/// Takes upstream work from the connections and commits it in batches, one transaction
/// per batch (the de-duplication records, dead letters and every handler's writes), with
/// retries for what fails. Three parts do the work: `UpstreamScheduler` decides (lanes,
/// lingering, retries), `UpstreamInbox` keeps the de-duplication record, and
/// `UpstreamDispatcher` runs the handlers; this class is the shell around them.
///
/// Nothing submitted is dropped: cancelling `run()` makes it return, at once, everything
/// not committed (the batch being committed included: its transaction is abandoned).
package final class UpstreamPipeline: Sendable {
    private final class Lane: Sendable {
        let index: Int
        let queue: BoundedQueue<UpstreamWork>
        let retries = BlockingLock(UpstreamScheduler.Retries())

        init(index: Int, capacity: Int, room: Doorbell) {
            self.index = index
            self.queue = BoundedQueue(capacity: capacity, onRoom: { room.ring() })
        }

        var nextRetry: ContinuousClock.Instant? { retries.withLock { $0.next } }
    }

    let pool: PostgresPool
    let scheduler: UpstreamScheduler
    let inbox: UpstreamInbox
    let dispatcher: UpstreamDispatcher
    let logger: Logger
    let observer: WorkerObserver?
    let metrics: any UpstreamMetrics
    /// The journal of journal mode, told what committed.
    package let journal: UpstreamJournal?
    /// What the lingering, the retries' due times, the outage backoff and the handlers'
    /// timeouts are timed by: the system's clock, or a test's `ManualClock`.
    let clock: any DeadlineClock
    private let lanes: [Lane]
    /// Rung when a lane that was full had work taken from it: a producer that could not wait
    /// for room (the HTTPS ingress's waiting requests) tries again.
    let room: Doorbell
    /// Set while a commit found the database unavailable, until one succeeds again (its
    /// return is said once, whichever lane sees it).
    private let databaseDown = Atomic(false)

    package init(pool: PostgresPool, handlers: UpstreamHandlers, settings: PipelineSettings, logger: Logger, observer: WorkerObserver?,
         metrics: any UpstreamMetrics, journal: UpstreamJournal? = nil, clock: any DeadlineClock = DeadlineThread.shared) {
        self.pool = pool
        self.clock = clock
        self.journal = journal
        self.metrics = metrics
        self.scheduler = UpstreamScheduler(settings: settings)
        self.inbox = UpstreamInbox(handlers: handlers)
        self.dispatcher = UpstreamDispatcher(handlers: handlers, logger: logger, metrics: metrics, clock: clock)
        self.logger = logger
        self.observer = observer
        let room = Doorbell()
        self.room = room
        self.lanes = (0..<scheduler.laneCount).map { Lane(index: $0, capacity: settings.queueCapacity, room: room) }
    }

    /// Queues each piece of `work` on its device's lane, in order, waiting while a lane is
    /// full. A cancelled caller's work is queued without waiting (never dropped).
    package func submit(_ work: [UpstreamWork]) async {
        guard lanes.count > 1 else { return await lanes[0].queue.push(contentsOf: work) }
        for (index, items) in split(work).enumerated() where !items.isEmpty {
            await lanes[index].queue.push(contentsOf: items)
        }
    }

    /// Queues `work` without waiting, for a producer that answers a client and cannot
    /// suspend (the HTTPS ingress, on its connection's thread): all of it, or none when a
    /// lane it goes to is full or the pipeline no longer takes work (the client is told to
    /// come back). Concurrent offers may each find room and together pass a lane's capacity
    /// by what they hold, never more.
    /// With `evenIfFull`, queues it all whatever room there is (work already promised: the
    /// caller checked `hasRoom(for:)` before it promised).
    @discardableResult
    func offer(_ work: [UpstreamWork], evenIfFull: Bool = false) -> Bool {
        let byLane = lanes.count > 1 ? split(work) : [work]
        if !evenIfFull {
            for (index, items) in byLane.enumerated() where !items.isEmpty && !lanes[index].queue.hasRoom { return false }
        }
        for (index, items) in byLane.enumerated() where !items.isEmpty {
            for item in items { _ = lanes[index].queue.offer { item } }
            lanes[index].queue.handOver()
        }
        return true
    }

    /// How much work the lanes hold when every one is full.
    var capacity: Int { lanes.count * (lanes.first?.queue.capacity ?? 0) }

    /// Whether each lane `work` goes to has room now.
    func hasRoom(for work: [UpstreamWork]) -> Bool {
        guard lanes.count > 1 else { return lanes[0].queue.hasRoom }
        return split(work).enumerated().allSatisfy { index, items in items.isEmpty || lanes[index].queue.hasRoom }
    }

    /// True while a commit found the database unavailable and none has succeeded since.
    package var isDatabaseDown: Bool { databaseDown.load(ordering: .relaxed) }

    /// Rung when the database answered someone else (the health probe) during an outage:
    /// the lanes waiting out their backoff try again at once.
    private let databaseAnswers = Doorbell()

    /// The database answered a probe: if an outage holds the lanes, they retry now rather
    /// than at the end of their backoff (durable posts are refused until a commit succeeds).
    package func databaseAnswered() {
        if databaseDown.load(ordering: .relaxed) { databaseAnswers.ring() }
    }

    /// Sleeps out an outage's backoff, or less if the database answers meanwhile; false
    /// when cancelled.
    private func waitOutOutage(_ delay: Duration) async -> Bool {
        await withTaskGroup(of: Bool.self) { group in
            group.addTask { await sleepUnlessCancelled(for: delay, clock: self.clock) }
            // No timeout of its own: the backoff's sleep above times the wait.
            group.addTask { await self.databaseAnswers.wait(timeout: .seconds(86_400)); return true }
            _ = await group.next()
            group.cancelAll()
            return !Task.isCancelled
        }
    }

    /// `work` by lane, in its order, each lane's list allocated once at its size: grown one
    /// piece at a time, a read's work took about three allocations per lane.
    ///
    /// Not async, and each piece read where it lies: iterated in the async `submit`, each
    /// was copied into its frame first.
    @inline(never)
    private func split(_ work: [UpstreamWork]) -> [[UpstreamWork]] {
        withUnsafeTemporaryAllocation(of: Int.self, capacity: work.count) { laneOfWork in
            var counts = [Int](repeating: 0, count: lanes.count)
            work.withUnsafeBufferPointer { buffer in
                for index in buffer.indices {
                    let lane = scheduler.lane(for: buffer[index].orderingKey)
                    laneOfWork[index] = lane
                    counts[lane] += 1
                }
            }
            var byLane = counts.map { count in
                var items: [UpstreamWork] = []
                items.reserveCapacity(count)
                return items
            }
            work.withUnsafeBufferPointer { buffer in
                for index in buffer.indices { byLane[laneOfWork[index]].append(buffer[index]) }
            }
            return byLane
        }
    }

    /// True once every lane gave up (`run()` cancelled, what they held returned): from then
    /// on only `takeLate()` takes what is submitted.
    var hasGivenUp: Bool { lanes.allSatisfy { $0.queue.isDrained } }

    /// Work queued or waiting for a retry, across lanes.
    package var backlog: Int { lanes.reduce(0) { $0 + $1.queue.count + $1.retries.withLock { $0.count } } }

    /// Processes until `close()` has been called and everything is committed; returns
    /// nothing then. Cancelled, it stops at once and returns what was not committed.
    package func run() async -> [UpstreamWork] {
        await withTaskGroup(of: [UpstreamWork].self) { group in
            for lane in lanes { group.addTask { await self.run(lane) } }
            var leftovers: [UpstreamWork] = []
            for await rest in group { leftovers += rest }
            return leftovers
        }
    }

    /// No more work will be submitted: `run()` returns once what is queued is done.
    package func close() {
        for lane in lanes { lane.queue.close() }
    }

    private func run(_ lane: Lane) async -> [UpstreamWork] {
        while true {
            if Task.isCancelled { return remaining(lane) }
            // Messages that failed before are retried alone: putting them in a batch would
            // only make it fail again.
            let due = lane.retries.withLock { $0.takeDue(at: clock.now, maximum: scheduler.settings.batchSize) }
            for (index, retry) in due.enumerated() {
                if let leftovers = await process([retry], in: lane) {
                    return leftovers + due[(index + 1)...] + remaining(lane)
                }
            }
            // Wait for new work, waking for the next retry.
            var batch = await lane.queue.take(maximum: scheduler.settings.batchSize, deadline: due.isEmpty ? lane.nextRetry : clock.now,
                                              clock: clock)
            if let linger = scheduler.linger(afterTaking: batch.count, closing: lane.queue.isClosed) {
                // One sleep, then whatever came meanwhile: cheaper than waking per arrival.
                await sleepUnlessCancelled(for: linger, clock: clock)
                batch += await lane.queue.take(maximum: scheduler.settings.batchSize - batch.count, deadline: clock.now, clock: clock)
            }
            if batch.isEmpty {
                if Task.isCancelled { return remaining(lane) }
                if !due.isEmpty { continue }
                if lane.queue.isClosed && lane.queue.count == 0 {
                    guard let next = lane.nextRetry else { return [] }
                    // Closed: `take` no longer waits, so wait here for the retry.
                    await sleepUnlessCancelled(for: next - clock.now, clock: clock)
                }
                continue
            }
            if let leftovers = await process(batch, in: lane) {
                return leftovers + remaining(lane)
            }
        }
    }

    /// What was submitted after cancelled lanes gave up and returned what they held: a
    /// producer still handing on then (a reading task draining its connection after the
    /// same cancellation) finds its work accepted but no lane to take it. The caller takes
    /// it once the producers are done, as it took `run()`'s leftovers.
    func takeLate() -> [UpstreamWork] {
        lanes.flatMap { remaining($0) }
    }

    /// Everything the lane still holds: retries, queued work, and what producers wait to queue.
    private func remaining(_ lane: Lane) -> [UpstreamWork] {
        lane.retries.withLock { $0.takeAll() } + lane.queue.takeAll()
    }

    /// Commits `batch`; on a handler or statement failure isolates each piece. Returns the
    /// batch back only when cancelled before it could commit.
    private func process(_ batch: [UpstreamWork], in lane: Lane) async -> [UpstreamWork]? {
        var batch = dispatcher.check(batch)
        var outage = scheduler.outageBackoff
        while true {
            if Task.isCancelled { return batch }
            do {
                let started = ContinuousClock.now
                let afterCommit = try await pool.withConnection { connection in try await self.commit(batch, on: connection, started: started) }
                if databaseDown.exchange(false, ordering: .relaxed) {
                    logger.notice("the database is reachable again: committing what waited (\(backlog) message(s) still queued)")
                }
                await acknowledge(batch)
                journal?.release(batch.withUnsafeBufferPointer { works in works.indices.compactMap { works[$0].journalSegment } })
                for action in afterCommit { await action() }
                return nil
            } catch let refusal as UpstreamDispatcher.Refusal {
                // Refused for good: dead-lettered in its place, and the rest commits as a batch.
                guard let index = batch.firstIndex(where: { $0.messageID == refusal.messageID }),
                      case .message(let message) = batch[index].kind else { return await failed(batch[0], error: refusal, in: lane) }
                logger.error("message \(refusal.messageID) refused by handler \(refusal.route), dead-lettered: \(refusal.error)",
                             metadata: ["message_id": refusal.messageID, "handler": refusal.route])
                batch[index] = UpstreamDispatcher.deadLetter(batch[index], message, error: refusal.description, handler: refusal.route,
                                                             code: UpstreamDispatcher.code(of: refusal.error))
            } catch let error as PostgresError where error.isDatabaseState {
                if Task.isCancelled { return batch }
                metrics.databaseError()
                let delay = outage.next()
                databaseDown.store(true, ordering: .relaxed)
                logger.warning("database unavailable (\(error.message)); \(batch.count + backlog) message(s) wait (this batch of \(batch.count) "
                               + "and \(backlog) queued), retrying in \(delay.formattedSeconds)")
                observer?(.databaseUnavailable(error.message))
                guard await waitOutOutage(delay) else { return batch }
            } catch {
                if Task.isCancelled { return batch }
                guard batch.count > 1 else { return await failed(batch[0], error: error, in: lane) }
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

    /// A single message failed: retry it later, or dead-letter it.
    private func failed(_ work: UpstreamWork, error: any Error, in lane: Lane) async -> [UpstreamWork]? {
        let description = String(describing: error)
        var generator = SystemRandomGenerator()
        let blame = UpstreamDispatcher.blame(error)
        switch scheduler.failure(of: work, description: description, permanent: UpstreamDispatcher.isPermanent(error),
                                 handler: blame.handler, code: blame.code, now: clock.now, using: &generator) {
        case .deadLetter(let letter):
            logger.error("message \(work.messageID ?? "?") failed \(letter.attempts) time(s), dead-lettered: \(description)",
                         metadata: ["message_id": work.messageID ?? ""])
            return await process([letter], in: lane)
        case .retryDeadLetter(let letter, _):
            logger.error("could not store a dead letter: \(description)")
            lane.retries.withLock { $0.schedule(letter) }
            return nil
        case .retry(let retry, let delay):
            lane.retries.withLock { $0.schedule(retry) }
            lane.queue.poke()
            let messageID = retry.messageID ?? "?"
            logger.warning("message \(messageID) failed (attempt \(retry.attempts) of \(scheduler.settings.maxAttempts)), "
                           + "retrying in \(delay.formattedSeconds): \(description)", metadata: ["message_id": messageID])
            metrics.retried()
            observer?(.retryScheduled(messageID: messageID, attempt: retry.attempts, delay: delay))
            return nil
        }
    }

    /// One transaction: de-duplication records, dead letters, then the handlers of the
    /// messages not seen before, then COMMIT. When the handlers' rows are the records,
    /// the whole batch goes in one round trip; otherwise the ids are recorded in
    /// `processed_upstream` before any handler runs. Returns the handlers' `afterCommit`
    /// actions.
    private func commit(_ batch: [UpstreamWork], on connection: PostgresConnection,
                        started: ContinuousClock.Instant) async throws -> [@Sendable () async -> Void] {
        var messages: [UpstreamMessage] = []
        var letters: [UpstreamWork.DeadLetter] = []
        var seen = Set<String>()
        var ids: [PostgresValue] = [], deadLettered: [PostgresValue] = []
        // Sized once: growing the set rehashed every id already in it (a few percent of
        // the handling tasks' CPU per message).
        seen.reserveCapacity(batch.count)
        messages.reserveCapacity(batch.count)
        ids.reserveCapacity(batch.count)
        // Read through the batch's buffer: through the array, each piece of work was
        // copied whole to be looked at (its reference counts up and down).
        var arrivals = 0
        batch.withUnsafeBufferPointer { works in
            for index in works.indices {
                switch works[index].kind {
                case .message(let message):
                    arrivals += 1
                    guard seen.insert(message.messageID).inserted else { continue }
                    messages.append(message)
                    ids.append(.text(message.messageID))
                case .deadLetter(let letter):
                    // A dead letter with an id is recorded too, so that a redelivery is not kept twice.
                    if let id = letter.messageID {
                        guard seen.insert(id).inserted else { continue }
                        ids.append(.text(id))
                        deadLettered.append(.text(id))
                    }
                    letters.append(letter)
                }
            }
        }
        let transaction = UpstreamTransaction(connection: connection)
        do {
            let firstSeen: Set<String>?
            if inbox.canCommitOptimistically(deadLettered: deadLettered) {
                do {
                    // One round trip: the check, the handlers' rows (the records), COMMIT. A
                    // redelivery fails it with a unique violation before anything commits.
                    inbox.openOptimistically(ids, into: transaction)
                    inbox.enqueue(letters, into: transaction)
                    try await dispatcher.handle(messages, in: transaction, batchingSingles: true)
                    transaction.enqueue(PostgresStatement("COMMIT"))
                    try await transaction.flush()
                    Self.markDuplicates(in: batch) { _ in true }
                    metrics.committed(batch: batch.count, took: (ContinuousClock.now - started).seconds, handled: messages.map(\.receivedAt),
                                      duplicates: arrivals - messages.count, deadLetters: letters.map(\.reason), at: Date())
                    observer?(.committed(handled: messages.map { ($0.messageID, $0.receivedAt) },
                                         duplicates: arrivals - messages.count, deadLettered: letters.map { $0.messageID ?? "" }))
                    return transaction.afterCommitActions
                } catch let error as PostgresError where error.isUniqueViolation {
                    _ = try await connection.execute("ROLLBACK")
                    transaction.discard()
                }
                firstSeen = try await inbox.openRecordingCarefully(ids, deadLettered: deadLettered, on: connection)
            } else {
                firstSeen = try await inbox.openRecording(ids, deadLettered: deadLettered, on: connection)
            }
            let fresh = { (id: String) in firstSeen?.contains(id) ?? true }
            let newMessages = messages.filter { fresh($0.messageID) }
            let written = letters.filter { $0.messageID.map(fresh) ?? true }
            inbox.enqueue(written, into: transaction)
            try await dispatcher.handle(newMessages, in: transaction, batchingSingles: false)
            transaction.enqueue(PostgresStatement("COMMIT"))
            try await transaction.flush()
            Self.markDuplicates(in: batch, fresh: fresh)
            metrics.committed(batch: batch.count, took: (ContinuousClock.now - started).seconds, handled: newMessages.map(\.receivedAt),
                              duplicates: arrivals - newMessages.count, deadLetters: written.map(\.reason), at: Date())
            observer?(.committed(handled: newMessages.map { ($0.messageID, $0.receivedAt) },
                                 duplicates: arrivals - newMessages.count, deadLettered: written.map { $0.messageID ?? "" }))
            return transaction.afterCommitActions
        } catch {
            _ = try? await connection.execute("ROLLBACK")
            throw error
        }
    }

    /// Tells the acks that report duplicates (HTTPS answers) which of a committed batch's
    /// messages were handled before: an id `fresh` says was not recorded before, or one
    /// that came earlier in the batch.
    private static func markDuplicates(in batch: [UpstreamWork], fresh: (String) -> Bool) {
        var firstInBatch = Set<String>()
        batch.withUnsafeBufferPointer { works in
            for index in works.indices {
                guard let ack = works[index].durableAck, ack.tracksDuplicates, let id = works[index].messageID else { continue }
                if !firstInBatch.insert(id).inserted || !fresh(id) { ack.markDuplicate() }
            }
        }
    }

    /// Sends the durable-mode acks of a committed batch, one write per connection. (The
    /// batch is read through its buffer, as in `commit`: no copy of each piece of work.)
    private func acknowledge(_ batch: [UpstreamWork]) async {
        let acks = batch.withUnsafeBufferPointer { works in works.indices.compactMap { works[$0].durableAck } }
        guard !acks.isEmpty else { return }
        for outcome in await DurableAck.send(acks) {
            if outcome.error == nil { metrics.durablyAcked(outcome.messageIDs.count) }
            if let error = outcome.error {
                logger.warning("could not ack \(outcome.messageIDs.count) message(s) (\(outcome.messageIDs.prefix(3).joined(separator: ","))…) "
                               + "on \(outcome.connection): \(error); CCS will redeliver them")
            } else {
                for messageID in outcome.messageIDs { observer?(.acked(connection: outcome.connection, messageID: messageID)) }
            }
        }
    }
}
