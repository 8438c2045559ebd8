import FCM
import Foundation
import Postgres
import Runtime
import XMPP

/// The outbox's XMPP transport (`xmpp`): sends rows over the worker's CCS connections
/// with FCM's rules.
///
/// - Places the rows its claim loop hands it with a `DownstreamScheduler`: at most 100
///   pending per connection, a slot freed only by that message's ack, nack or stanza error;
///   a draining connection takes nothing more; what was pending on a closed connection is
///   sent again on another. It wants the free slots of its connections plus a read-ahead.
/// - Turns every answer into a `DownstreamVerdict`, settles it (`OutboxSettlement`) and
///   records the row's state for the write-back: sent, acked, delivered, failed, retry,
///   expired; marks tokens.
///
/// Each connection gets a send loop (`attach`), a child task of `run`; the connection's
/// reader reports answers (`received`), receipts, draining and the end of the connection
/// (`detach`).
package final class XMPPTransport: DownstreamTransport, CCSLinks {
    /// Counters, logged at shutdown.
    package struct Statistics: Sendable, CustomStringConvertible {
        package var claimed = 0
        package var sent = 0
        package var acked = 0
        package var nacked = 0
        package var failed = 0
        package var retried = 0
        package var expired = 0
        package var resent = 0

        package var description: String {
            "claimed \(claimed), sent \(sent), acked \(acked), nacked \(nacked) (failed \(failed), retried \(retried), "
                + "expired \(expired)), resent after a lost or draining connection \(resent)"
        }
    }

    /// Free slots that make a busy link send again (see `takeForWaiters`).
    package static let refillSlots = 8
    private static let messageIDPrefix = "ds-"

    private struct State {
        package var scheduler = DownstreamScheduler()
        package var waiters: [Int: CheckedContinuation<Batch?, Never>] = [:]
        package var nextLink = 0
        package var taking = true
        package var finished = false
        /// Tasks waiting until nothing sent is unanswered (shutdown).
        package var answerWaiters = Waiters<Bool>()
        /// When unanswered messages were last looked for.
        package var lastExpiryCheck = ContinuousClock.now
        package var statistics = Statistics()
        /// The connection label of each link (for metrics).
        package var labels: [Int: String] = [:]
    }

    private typealias Batch = (placed: [DownstreamScheduler.Placement], deferred: [DownstreamScheduler.Deferral])

    package let settings: DownstreamSettings
    private let recorder: OutboxRecorder
    private let logger: Logger
    private let metrics: any OutboxMetrics
    private let state = BlockingLock(State())
    /// Rings its claim loop (also on each write-back commit, and on NOTIFY).
    private var doorbell: Doorbell { recorder.doorbell }

    /// A connection attached and waiting for its send loop in `run`.
    private struct AttachedLink: Sendable {
        let link: Int
        let connection: CCSConnection
    }
    private let attached: AsyncStream<AttachedLink>
    private let attaching: AsyncStream<AttachedLink>.Continuation

    package init(recorder: OutboxRecorder, settings: DownstreamSettings, logger: Logger, metrics: any OutboxMetrics) {
        self.metrics = metrics
        self.settings = settings
        self.recorder = recorder
        self.logger = logger
        (attached, attaching) = AsyncStream.makeStream(of: AttachedLink.self)
    }

    /// Runs each attached connection's send loop as a child task, until cancelled (the
    /// outbox cancels it once `finish` is done). A loop ends by itself once its link is
    /// drained or detached, or the transport finished; one still writing to a peer that
    /// stopped reading ends with the cancellation, so a shutdown never waits on it.
    package func run() async {
        await withDiscardingTaskGroup { group in
            for await link in attached {
                group.addTask { await self.sendLoop(link: link.link, connection: link.connection) }
            }
        }
    }

    package var name: String { "xmpp" }
    package var validatesRows: Bool { true }
    package var isStopped: Bool { false }
    package var answerTimeout: Duration { settings.answerTimeout }

    package func messageID(forRow id: Int64) -> String { Self.messageIDPrefix + String(id) }

    package var statistics: Statistics { state.withLock { $0.statistics } }

    /// Each open connection's window.
    package var windows: [ConnectionWindow] {
        state.withLock { state in
            state.scheduler.linkStates.map {
                ConnectionWindow(label: state.labels[$0.link] ?? "link \($0.link)", pending: $0.pending, draining: $0.draining)
            }
        }
    }

    /// Hands row updates to the write-back, counted for metrics; returns the write's number.
    @discardableResult
    private func record(_ updates: [OutboxUpdate], tokens: [TokenMark] = []) -> UInt64 {
        recorder.record(updates, tokens: tokens)
    }

    // MARK: - Shutdown

    /// Stops claiming, hands back what was claimed and never sent, waits until `deadline`
    /// (or an urgent shutdown) for the answers to what is pending, then hands back what is
    /// still unanswered (sent again by the next worker: at-least-once).
    package func finish(until deadline: ContinuousClock.Instant, shutdown: ShutdownSignal) async {
        let unsent = state.withLock { state -> [OutgoingDownstream] in
            state.taking = false
            return state.scheduler.removeAllReady()
        }
        doorbell.ring()
        let now = Date()
        record(unsent.map { OutboxSettlement.handBack(rowID: $0.rowID, sentBefore: $0.attempt > 1, now: now) })
        shutdown.onUrgent { [self] in wakeAnswerWaiters() }
        _ = await state.suspend(in: \.answerWaiters, cancelled: false, deadline: deadline, timedOut: false) { state in
            state.scheduler.pendingCount == 0 || shutdown.isUrgent ? true : nil
        }
        let (unanswered, waiters) = state.withLock { state -> ([OutgoingDownstream], [CheckedContinuation<Batch?, Never>]) in
            state.finished = true
            defer { state.waiters.removeAll() }
            // They were sent: handed back as retries. (Messages of a connection that closed
            // meanwhile were put back in the queue: handed back too.)
            let sent = state.scheduler.removeAllPending().map { message in
                var sent = message
                sent.attempt += 1
                return sent
            }
            return (sent + state.scheduler.removeAllReady(), Array(state.waiters.values))
        }
        for waiter in waiters { waiter.resume(returning: nil) }
        if !unanswered.isEmpty {
            logger.warning("\(unanswered.count) downstream message(s) were not answered before shutdown; they are handed back and will be sent again")
        }
        let handedBack = Date()
        record(unanswered.map { OutboxSettlement.handBack(rowID: $0.rowID, sentBefore: $0.attempt > 1, now: handedBack) })
        logger.info("outbox over XMPP: \(statistics)")
    }

    /// Wakes `finish` when nothing is pending any more (or the shutdown became urgent).
    private func wakeAnswerWaiters() {
        let waiters = state.withLock { $0.answerWaiters.removeAll() }
        for waiter in waiters { waiter.resume(returning: true) }
    }

    // MARK: - Connections

    /// Starts sending on `connection`; returns its link id for `received`, `drain` and `detach`.
    package func attach(_ connection: CCSConnection) -> Int {
        let link = state.withLock { state -> Int in
            state.nextLink += 1
            state.scheduler.open(state.nextLink)
            state.labels[state.nextLink] = connection.label
            return state.nextLink
        }
        doorbell.ring()
        attaching.yield(AttachedLink(link: link, connection: connection))
        return link
    }

    /// CCS is draining the link's connection: nothing more is sent on it.
    package func drain(_ link: Int) {
        let waiter = state.withLock { state -> CheckedContinuation<Batch?, Never>? in
            state.scheduler.drain(link)
            return state.waiters.removeValue(forKey: link)
        }
        waiter?.resume(returning: nil)
        doorbell.ring()
    }

    /// `placed` was taken for the link but its draining connection refused it: it goes
    /// to the other links (its `sent` updates are superseded by the next send's).
    private func withdraw(_ placed: [DownstreamScheduler.Placement], from link: Int) {
        let (withdrawn, wake) = state.withLock { state -> (Int, [(CheckedContinuation<Batch?, Never>, Batch?)]) in
            let withdrawn = state.scheduler.withdraw(placed, from: link)
            state.statistics.resent += withdrawn
            return (withdrawn, takeForWaiters(&state))
        }
        if withdrawn > 0 { logger.info("\(withdrawn) downstream message(s) taken for a connection CCS is draining go out on another") }
        resume(wake)
        doorbell.ring()
        wakeAnswerWaitersIfDone()
    }

    /// The link's connection ended: what was pending on it is sent on another.
    package func detach(_ link: Int) {
        let (moved, wake) = state.withLock { state -> (Int, [(CheckedContinuation<Batch?, Never>, Batch?)]) in
            let moved = state.scheduler.close(link)
            state.labels[link] = nil
            state.statistics.resent += moved
            var wake: [(CheckedContinuation<Batch?, Never>, Batch?)] = []
            if let waiter = state.waiters.removeValue(forKey: link) { wake.append((waiter, nil)) }
            wake += takeForWaiters(&state)
            return (moved, wake)
        }
        if moved > 0 { logger.info("\(moved) downstream message(s) pending on a closed connection go out on another") }
        resume(wake)
        doorbell.ring()
        wakeAnswerWaitersIfDone()
    }

    /// An answer read on the link's connection.
    package func received(_ answer: DownstreamAnswer, on link: Int) {
        received([answer], on: link)
    }

    /// Answers read on the link's connection, in their order: handled under one lock, their
    /// updates recorded together, and the link refilled once for all of them. Delivery
    /// receipts (of messages any worker sent) are recorded apart.
    package func received(_ answers: [DownstreamAnswer], on link: Int) {
        guard !answers.isEmpty else { return }
        for case .receipt(let original, let receivedAt) in answers { receipt(originalMessageID: original, at: receivedAt) }
        let now = ContinuousClock.now
        let date = Date()
        var updates: [OutboxUpdate] = []
        var tokens: [TokenMark] = []
        var badAcks: [String] = []
        var retryDue: [ContinuousClock.Instant] = []
        var claimNow = false
        var drained: [CheckedContinuation<Bool, Never>] = []
        let wake = state.withLock { state -> [(CheckedContinuation<Batch?, Never>, Batch?)] in
            defer {
                // A shutdown waiting for the last answers is told when they are all in.
                if !state.answerWaiters.isEmpty && state.scheduler.pendingCount == 0 { drained = state.answerWaiters.removeAll() }
            }
            var generator = SystemRandomGenerator()
            var resendElsewhere = false
            var roundTrips: [Double] = []
            roundTrips.reserveCapacity(answers.count)
            for answer in answers {
                let found: DownstreamScheduler.Answered?
                switch answer {
                case .ack(let messageID, _), .nack(let messageID, _, _):
                    found = state.scheduler.answered(link: link, messageID: messageID)
                case .stanzaError(let stanzaID, _, _):
                    found = state.scheduler.stanzaError(link: link, stanzaID: stanzaID)
                case .stanzaErrorForMessage(let messageID, _, _):
                    found = state.scheduler.answered(link: link, messageID: messageID)
                case .receipt:
                    found = nil
                }
                guard let found else { continue }
                let message = found.message
                roundTrips.append((now - found.sentAt).seconds)
                // The message's age matters to a nack's retry only (an ack's verdict is fixed).
                var age: Duration { .seconds(max(0, date.timeIntervalSince(message.createdAt))) }
                let verdict: DownstreamVerdict
                switch answer {
                case .ack(_, let canonical):
                    verdict = .acked(canonicalToken: canonical)
                case .nack(_, let code, let description):
                    if code == "BAD_ACK" { badAcks.append(description ?? "") }
                    verdict = .nack(code: code, description: description, attempt: message.attempt, age: age,
                                    timeToLive: message.timeToLive, policy: settings.retry, using: &generator)
                case .stanzaError(_, let condition, let text), .stanzaErrorForMessage(_, let condition, let text):
                    verdict = .stanzaError(condition: condition, text: text, attempt: message.attempt, age: age,
                                           timeToLive: message.timeToLive, policy: settings.retry, using: &generator)
                case .receipt:
                    continue
                }
                apply(verdict, to: message, link: link, now: now, date: date, state: &state, updates: &updates, tokens: &tokens, due: &retryDue)
                if case .resendElsewhere = verdict { resendElsewhere = true }
            }
            guard !roundTrips.isEmpty else { return [] }
            metrics.downstreamRoundTrips(roundTrips)
            let number = record(updates, tokens: tokens)
            for due in retryDue { recorder.retry(dueAt: due, written: number) }
            var wake = takeForWaiters(&state, only: link, refilling: true)
            if resendElsewhere { wake += takeForWaiters(&state) }
            claimNow = wanted(state) >= claimThreshold
            return wake
        }
        for badAck in badAcks { logger.error("CCS answered BAD_ACK (\(badAck)): an ack we sent was malformed; this is a bug in fcm-worker") }
        resume(wake)
        if claimNow { doorbell.ring() }
        for waiter in drained { waiter.resume(returning: true) }
    }

    /// Wakes `finish` once nothing sent is unanswered.
    private func wakeAnswerWaitersIfDone() {
        let waiters = state.withLock { state -> [CheckedContinuation<Bool, Never>] in
            state.answerWaiters.isEmpty || state.scheduler.pendingCount > 0 ? [] : state.answerWaiters.removeAll()
        }
        for waiter in waiters { waiter.resume(returning: true) }
    }

    /// A delivery receipt for the message sent as `originalMessageID` (by any worker).
    private func receipt(originalMessageID: String, at date: Date) {
        guard originalMessageID.hasPrefix(Self.messageIDPrefix),
              let rowID = Int64(originalMessageID.dropFirst(Self.messageIDPrefix.count)) else {
            logger.warning("a delivery receipt for \(originalMessageID), which is not an outbox message id")
            return
        }
        record([OutboxUpdate(rowID: rowID, status: .delivered, deliveredAt: date)])
    }

    private func apply(_ verdict: DownstreamVerdict, to message: OutgoingDownstream, link: Int, now: ContinuousClock.Instant,
                       date: Date, state: inout State, updates: inout [OutboxUpdate], tokens: inout [TokenMark],
                       due: inout [ContinuousClock.Instant]) {
        let settlement = OutboxSettlement.xmpp(verdict, rowID: message.rowID, target: message.target,
                                               targetIsToken: message.targetIsToken, now: date)
        tokens += settlement.tokens
        switch verdict {
        case .acked: state.statistics.acked += 1
        case .failed: state.statistics.nacked += 1; state.statistics.failed += 1
        case .retry, .slowDown: state.statistics.nacked += 1; state.statistics.retried += 1
        case .expired: state.statistics.nacked += 1; state.statistics.expired += 1
        case .resendElsewhere: state.statistics.resent += 1
        }
        if let slowDown = settlement.slowDown {
            for target in slowDown.targets { state.scheduler.slowDown(target: target, until: now + slowDown.duration) }
        }
        guard let update = settlement.update else {
            // CONNECTION_DRAINING as a nack: this connection is draining; send it elsewhere.
            state.scheduler.drain(link)
            var again = message
            again.attempt += 1
            state.scheduler.enqueueFront(again)
            return
        }
        if update.status == .retry, let availableAt = update.availableAt {
            due.append(now + .seconds(max(0, availableAt.timeIntervalSince(date))))
        }
        updates.append(update)
    }

    // MARK: - Sending

    private func sendLoop(link: Int, connection: CCSConnection) async {
        while let batch = await nextBatch(for: link) {
            guard !batch.placed.isEmpty else { continue }
            let date = Date()
            let leaseEnd = date.addingTimeInterval(settings.lease.seconds)
            // Recorded before the bytes leave, so an answer's update always comes after.
            record(batch.placed.map {
                OutboxUpdate(rowID: $0.message.rowID, status: .sent, attempts: $0.message.attempt, sentOn: connection.label, sentAt: date,
                             availableAt: leaseEnd)
            })
            var text = ""
            text.reserveCapacity(batch.placed.reduce(0) { $0 + $1.message.json.utf8.count + 80 })
            for placement in batch.placed {
                CCSStanza.appendMessage(json: placement.message.json, id: placement.stanzaID, to: &text)
            }
            do {
                guard try await connection.send(serialized: text) else {
                    // CCS announced draining after this batch was taken: none of it was
                    // written, and it goes out on another connection at once.
                    withdraw(batch.placed, from: link)
                    return
                }
            } catch {
                // The connection ended; `detach` moves what is pending on it elsewhere.
                return
            }
            state.withLock { $0.statistics.sent += batch.placed.count }
        }
    }

    /// Waits until the link has free slots and messages are waiting; nil once the link
    /// is draining or closed, or the sender has finished.
    private func nextBatch(for link: Int) async -> Batch? {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Batch?, Never>) in
                let immediate = state.withLock { state -> Batch?? in
                    // Checked under the lock: a cancellation after it finds the waiter.
                    if Task.isCancelled || state.finished || !state.scheduler.accepts(link) { return .some(nil) }
                    if state.scheduler.canTake(for: link) { return .some(take(for: link, &state)) }
                    state.waiters[link] = continuation
                    return .none
                }
                if let immediate { continuation.resume(returning: immediate) }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: link) }?.resume(returning: nil)
        }
    }

    /// Takes a batch for `link`; messages to slowed-down targets go back to the outbox
    /// as retries for when the slowdown ends.
    private func take(for link: Int, _ state: inout State) -> Batch {
        let now = ContinuousClock.now
        let batch = state.scheduler.take(for: link, now: now)
        guard !batch.deferred.isEmpty else { return batch }
        state.statistics.retried += batch.deferred.count
        let date = Date()
        let number = record(batch.deferred.map {
            OutboxUpdate(rowID: $0.message.rowID, status: .retry, availableAt: date.addingTimeInterval(max(0, ($0.until - now).seconds)))
        })
        for deferral in batch.deferred { recorder.retry(dueAt: deferral.until, written: number) }
        return batch
    }

    /// Fills the waiting links that can take messages now (`only`: just that link). When
    /// `refilling` after an answer, a link is filled once it has `refillSlots` free (or the
    /// queue holds no more than it has free), so that sends go out in batches rather than
    /// one stanza, one write and one wakeup per answer.
    private func takeForWaiters(_ state: inout State, only: Int? = nil, refilling: Bool = false) -> [(CheckedContinuation<Batch?, Never>, Batch?)] {
        var wake: [(CheckedContinuation<Batch?, Never>, Batch?)] = []
        for link in only.map({ [$0] }) ?? Array(state.waiters.keys) {
            guard state.waiters[link] != nil else { continue }
            if refilling {
                let free = state.scheduler.freeSlots(on: link)
                if free < Self.refillSlots && state.scheduler.readyCount > free { continue }
            }
            if !state.scheduler.accepts(link) {
                wake.append((state.waiters.removeValue(forKey: link)!, nil))
            } else if state.scheduler.canTake(for: link) {
                wake.append((state.waiters.removeValue(forKey: link)!, take(for: link, &state)))
            }
        }
        return wake
    }

    private func resume(_ wake: [(CheckedContinuation<Batch?, Never>, Batch?)]) {
        for (continuation, batch) in wake { continuation.resume(returning: batch) }
    }

    // MARK: - The claim loop's transport

    /// How many rows to claim now: the free slots of the sending connections plus a
    /// read-ahead, minus what waits already; 0 once it takes no more (shutdown).
    private func wanted(_ state: State) -> Int {
        guard state.taking, state.scheduler.sendingLinks > 0 else { return 0 }
        let target = state.scheduler.freeSlots + state.scheduler.sendingLinks * settings.readAheadPerConnection
        return max(0, target - state.scheduler.readyCount)
    }

    package func wantedRows() -> Int { state.withLock { wanted($0) } }

    /// Rows worth a claim query: half the read-ahead, at most three windows, so claims come
    /// in batches (a claim's fixed cost is that of dozens of rows). It never holds a send
    /// back: while fewer rows are wanted, more than that many wait ready to go.
    package var claimThreshold: Int { max(1, min(settings.readAheadPerConnection, 6 * DownstreamWindow.ccsCapacity) / 2) }

    package func tick() {
        expireUnanswered()
    }

    /// The claimed messages as the scheduler places them: their CCS JSON written, their next
    /// attempt.
    ///
    /// Not async, and kept out of `send`: each claimed message (several hundred bytes: its
    /// row and its message) is read where it lies, through the list's buffer. Read in an async
    /// function, each was copied whole into its frame first (a few dozen reference counts up
    /// and down, about 1.5 % of the worker's CPU per downstream message).
    @inline(never)
    private func outgoing(_ messages: [ClaimedMessage]) -> [OutgoingDownstream] {
        var ready: [OutgoingDownstream] = []
        ready.reserveCapacity(messages.count)
        messages.withUnsafeBufferPointer { buffer in
            for index in buffer.indices {
                let claimed = buffer.baseAddress! + index
                ready.append(OutgoingDownstream(
                    rowID: claimed.pointee.row.id, messageID: messageID(forRow: claimed.pointee.row.id),
                    target: claimed.pointee.message.to ?? claimed.pointee.message.condition ?? "",
                    targetIsToken: claimed.pointee.message.to.map { !$0.hasPrefix("/topics/") } ?? false,
                    json: Self.wireJSON(of: claimed.pointee.message, payloadText: claimed.pointee.row.payload,
                                        payloadHasMessageID: claimed.pointee.payloadHasMessageID),
                    createdAt: claimed.pointee.row.createdAt, timeToLive: claimed.pointee.message.timeToLive,
                    attempt: claimed.pointee.row.attempts + 1))
            }
        }
        return ready
    }

    /// Queues the claimed rows for the connections, which send them as their windows allow.
    package func send(_ messages: [ClaimedMessage]) async {
        let ready = outgoing(messages)
        let (wake, taken) = state.withLock { state -> ([(CheckedContinuation<Batch?, Never>, Batch?)], Bool) in
            guard state.taking else { return ([], false) }
            state.scheduler.enqueue(ready)
            return (takeForWaiters(&state), true)
        }
        guard taken else {
            // Claimed as the shutdown began: back to the outbox, unsent.
            let now = Date()
            record(ready.map { OutboxSettlement.handBack(rowID: $0.rowID, sentBefore: $0.attempt > 1, now: now) })
            return
        }
        resume(wake)
    }

    /// Frees the slots of messages whose answer is `answerTimeout` late (lost, or refused
    /// by a stanza error that named no stanza) and sends them again.
    private func expireUnanswered() {
        let now = ContinuousClock.now
        let (expired, wake) = state.withLock { state -> (Int, [(CheckedContinuation<Batch?, Never>, Batch?)]) in
            // Looked for once a second at most: it visits every pending message.
            guard now - state.lastExpiryCheck >= .seconds(1) else { return (0, []) }
            state.lastExpiryCheck = now
            let expired = state.scheduler.expireUnanswered(sentBefore: now - settings.answerTimeout)
            state.statistics.resent += expired
            return (expired, expired > 0 ? takeForWaiters(&state) : [])
        }
        guard expired > 0 else { return }
        logger.warning("\(expired) downstream message(s) got no answer within \(settings.answerTimeout.formattedSeconds): sent again")
        resume(wake)
    }

    /// The CCS JSON of a validated message: its id and target, then the row's payload text
    /// as PostgreSQL wrote it (valid JSON whose fields were all just checked), which
    /// spares re-serialising every message. A payload carrying its own `message_id` is
    /// serialised from the parsed message instead, so the id is never doubled.
    package static func wireJSON(of message: borrowing DownstreamMessage, payloadText: String, payloadHasMessageID: Bool) -> String {
        let body = payloadText.utf8.drop { $0 == 0x20 || $0 == 0x0A || $0 == 0x09 || $0 == 0x0D }
        guard body.first == UInt8(ascii: "{"), !payloadHasMessageID else { return message.json.serialized }
        // Sized once for what it will hold (its parts, quotes and punctuation; escapes are
        // rare), instead of growing several times on the way to a few hundred bytes.
        var json = ""
        json.reserveCapacity(payloadText.utf8.count + message.messageID.utf8.count
                             + (message.to ?? message.condition ?? "").utf8.count + 40)
        json += "{\"message_id\":"
        JSONValue.appendQuoted(message.messageID, to: &json)
        if let to = message.to {
            json += ",\"to\":"
            JSONValue.appendQuoted(to, to: &json)
        } else if let condition = message.condition {
            json += ",\"condition\":"
            JSONValue.appendQuoted(condition, to: &json)
        }
        let rest = Substring(body.dropFirst()).drop { $0 == " " || $0 == "\n" || $0 == "\t" || $0 == "\r" }
        if rest.first != "}" { json += "," }
        json += rest
        return json
    }
}
