import FCM
import Foundation
import Postgres
import Runtime
import XMPP

/// Sends the outbox rows of transport `xmpp` over the worker's CCS connections with FCM's
/// rules: the XMPP shell of the `Outbox`.
///
/// - Claims due rows (`OutboxStore`), woken by NOTIFY, never more than the open windows
///   can take plus a read-ahead; sweeps for rows due again (retries, rows handed back,
///   expired claims) every sweep interval and when a retry it wrote falls due.
/// - Places them with a `DownstreamScheduler`: at most 100 pending per connection, a slot
///   freed only by that message's ack, nack or stanza error; a draining connection takes
///   nothing more; what was pending on a closed connection is sent again on another.
/// - Turns every answer into a `DownstreamVerdict`, settles it (`OutboxSettlement`) and
///   records the row's state for the write-back: sent, acked, delivered, failed, retry,
///   expired; marks tokens.
///
/// Each connection gets a send loop (`attach`); the connection's reader reports answers
/// (`received`), receipts, draining and the end of the connection (`detach`).
final class XMPPOutboxSender: Sendable {
    /// What a connection's reader saw that concerns downstream messages.
    enum Answer: Sendable {
        case ack(messageID: String, canonicalToken: String?)
        case nack(messageID: String, code: String, description: String?)
        case stanzaError(stanzaID: String, condition: String, text: String?)
        /// A stanza error without a stanza id, whose echoed payload named the message.
        case stanzaErrorForMessage(messageID: String, condition: String, text: String?)
    }

    /// Counters, logged at shutdown.
    struct Statistics: Sendable, CustomStringConvertible {
        var claimed = 0
        var sent = 0
        var acked = 0
        var nacked = 0
        var failed = 0
        var retried = 0
        var expired = 0
        var resent = 0

        var description: String {
            "claimed \(claimed), sent \(sent), acked \(acked), nacked \(nacked) (failed \(failed), retried \(retried), "
                + "expired \(expired)), resent after a lost or draining connection \(resent)"
        }
    }

    /// Free slots that make a busy link send again (see `takeForWaiters`).
    static let refillSlots = 8
    private static let messageIDPrefix = "ds-"

    private struct State {
        var scheduler = DownstreamScheduler()
        var waiters: [Int: CheckedContinuation<Batch?, Never>] = [:]
        var nextLink = 0
        var claiming = true
        var finished = false
        /// Tasks waiting until nothing sent is unanswered (shutdown).
        var answerWaiters = Waiters<Bool>()
        /// When unanswered messages were last looked for.
        var lastExpiryCheck = ContinuousClock.now
        var statistics = Statistics()
        /// When scheduled retries fall due: the claim loop wakes for each, and sweeps.
        var retryTimes = DueTimes()
        /// A retry fell due: the next claim sweeps.
        var sweepWanted = true
        /// The connection label of each link (for metrics).
        var labels: [Int: String] = [:]
    }

    /// A connection's window, for metrics.
    struct Window: Sendable {
        let label: String
        let pending: Int
        let draining: Bool
    }

    private typealias Batch = (placed: [DownstreamScheduler.Placement], deferred: [DownstreamScheduler.Deferral])

    let settings: DownstreamSettings
    private let store: OutboxStore
    private let writeBack: OutboxWriteBack
    private let logger: Logger
    private let metrics: WorkerMetrics
    private let state = BlockingLock(State())
    /// Expired rows are logged once a minute per reason.
    private let refusalWarnings = WarningThrottle()
    /// Rung on NOTIFY, on each write-back commit, and when rows are wanted.
    let doorbell: Doorbell

    init(store: OutboxStore, writeBack: OutboxWriteBack, doorbell: Doorbell, settings: DownstreamSettings, logger: Logger,
         metrics: WorkerMetrics) {
        self.metrics = metrics
        self.settings = settings
        self.store = store
        self.writeBack = writeBack
        self.doorbell = doorbell
        self.logger = logger
    }

    var statistics: Statistics { state.withLock { $0.statistics } }

    /// Each open connection's window.
    var windows: [Window] {
        state.withLock { state in
            state.scheduler.linkStates.map { Window(label: state.labels[$0.link] ?? "link \($0.link)", pending: $0.pending, draining: $0.draining) }
        }
    }

    /// Hands row updates to the write-back, counted for metrics; returns the write's number.
    @discardableResult
    private func record(_ updates: [OutboxUpdate], tokens: [TokenMark] = []) -> UInt64 {
        metrics.downstream(updates, transport: "xmpp")
        return writeBack.record(updates, tokens: tokens)
    }

    // MARK: - Shutdown

    /// Stops claiming, hands back what was claimed and never sent, waits until `deadline`
    /// (or an urgent shutdown) for the answers to what is pending, then hands back what is
    /// still unanswered (sent again by the next worker: at-least-once).
    func finish(until deadline: ContinuousClock.Instant, shutdown: ShutdownSignal) async {
        let unsent = state.withLock { state -> [OutgoingDownstream] in
            state.claiming = false
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
    func attach(_ connection: CCSConnection) -> Int {
        let link = state.withLock { state -> Int in
            state.nextLink += 1
            state.scheduler.open(state.nextLink)
            state.labels[state.nextLink] = connection.label
            return state.nextLink
        }
        doorbell.ring()
        Task { await sendLoop(link: link, connection: connection) }
        return link
    }

    /// CCS is draining the link's connection: nothing more is sent on it.
    func drain(_ link: Int) {
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
    func detach(_ link: Int) {
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
    func received(_ answer: Answer, on link: Int) {
        received([answer], on: link)
    }

    /// Answers read on the link's connection, in their order: handled under one lock, their
    /// updates recorded together, and the link refilled once for all of them.
    func received(_ answers: [Answer], on link: Int) {
        guard !answers.isEmpty else { return }
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
                let found: (OutgoingDownstream, sentAt: ContinuousClock.Instant)?
                switch answer {
                case .ack(let messageID, _), .nack(let messageID, _, _):
                    found = state.scheduler.answered(link: link, messageID: messageID)
                case .stanzaError(let stanzaID, _, _):
                    found = state.scheduler.stanzaError(link: link, stanzaID: stanzaID)
                case .stanzaErrorForMessage(let messageID, _, _):
                    found = state.scheduler.answered(link: link, messageID: messageID)
                }
                guard let (message, sentAt) = found else { continue }
                roundTrips.append((now - sentAt).seconds)
                let age = Duration.seconds(max(0, date.timeIntervalSince(message.createdAt)))
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
                }
                apply(verdict, to: message, link: link, now: now, date: date, state: &state, updates: &updates, tokens: &tokens, due: &retryDue)
                if case .resendElsewhere = verdict { resendElsewhere = true }
            }
            guard !roundTrips.isEmpty else { return [] }
            metrics.downstreamRoundTrip.withLock { histogram in for seconds in roundTrips { histogram.observe(seconds) } }
            // Recorded under the lock, so that a retry's due time knows its write's number.
            let number = record(updates, tokens: tokens)
            for due in retryDue { state.retryTimes.insert(due, written: number) }
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
    func receipt(originalMessageID: String, at date: Date) {
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
        await withCheckedContinuation { (continuation: CheckedContinuation<Batch?, Never>) in
            let immediate = state.withLock { state -> Batch?? in
                if state.finished || !state.scheduler.accepts(link) { return .some(nil) }
                if state.scheduler.canTake(for: link) { return .some(take(for: link, &state)) }
                state.waiters[link] = continuation
                return .none
            }
            if let immediate { continuation.resume(returning: immediate) }
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
        for deferral in batch.deferred { state.retryTimes.insert(deferral.until, written: number) }
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

    // MARK: - Claiming

    /// How many rows to claim now: the free slots of the sending connections plus a
    /// read-ahead, minus what waits already; 0 while the write-back lags far behind.
    private func wanted(_ state: State) -> Int {
        guard state.claiming, state.scheduler.sendingLinks > 0 else { return 0 }
        let target = state.scheduler.freeSlots + state.scheduler.sendingLinks * settings.readAheadPerConnection
        return max(0, target - state.scheduler.readyCount)
    }

    /// Rows worth a claim query: half the read-ahead, at most three windows, so claims come
    /// in batches (a claim's fixed cost is that of dozens of rows). It never holds a send
    /// back: while fewer rows are wanted, more than that many wait ready to go.
    private var claimThreshold: Int { max(1, min(settings.readAheadPerConnection, 6 * DownstreamWindow.ccsCapacity) / 2) }

    /// Claims rows as the windows make room, until `finish` or cancellation.
    func claimLoop() async {
        var outage = Backoff.outage(base: .milliseconds(100), cap: .seconds(10))
        var lastSweep: ContinuousClock.Instant?
        while state.withLock({ $0.claiming }) && !Task.isCancelled {
            expireUnanswered()
            let wanted = state.withLock { self.wanted($0) }
            guard wanted >= claimThreshold, writeBack.backlog < 50_000 else {
                await doorbell.wait(timeout: sweepWait())
                continue
            }
            let limit = min(wanted, 2000)
            let rows: [OutboxStore.ClaimedRow]
            do {
                let now = ContinuousClock.now
                let sweeping = state.withLock { state in
                    defer { state.sweepWanted = false }
                    return state.sweepWanted || lastSweep.map { now - $0 >= settings.sweepInterval } ?? true
                }
                do {
                    rows = try await store.claim(limit: limit, sweeping: sweeping)
                } catch {
                    if sweeping { state.withLock { $0.sweepWanted = true } }
                    throw error
                }
                if sweeping { lastSweep = now }
                outage.reset()
            } catch {
                guard !Task.isCancelled else { return }
                let delay = outage.next()
                logger.warning("could not claim outbox rows (retrying in \(delay.formattedSeconds)): \(error)")
                await doorbell.wait(timeout: delay)
                continue
            }
            let (ready, updates) = prepare(rows)
            record(updates)
            let wake = state.withLock { state -> [(CheckedContinuation<Batch?, Never>, Batch?)] in
                state.statistics.claimed += rows.count
                state.scheduler.enqueue(ready)
                return takeForWaiters(&state)
            }
            resume(wake)
            if rows.count < limit { await doorbell.wait(timeout: sweepWait()) }
        }
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

    /// Until the next sweep, or until the next scheduled retry falls due if sooner.
    private func sweepWait() -> Duration {
        state.withLock { state in
            // A few milliseconds late, so that the row's write-back has landed.
            let (passed, next) = state.retryTimes.popPassed(before: .now, written: writeBack.committed)
            if passed {
                state.sweepWanted = true
                return .zero
            }
            guard let next else { return settings.sweepInterval }
            // A retry due but not yet written: the write's commit rings the doorbell.
            return min(settings.sweepInterval, max(.milliseconds(20), next - .now))
        }
    }

    /// Claimed rows as messages to send, and the rows settled without sending (invalid,
    /// expired, or to a token FCM refused before).
    private func prepare(_ rows: [OutboxStore.ClaimedRow]) -> ([OutgoingDownstream], [OutboxUpdate]) {
        var ready: [OutgoingDownstream] = []
        var updates: [OutboxUpdate] = []
        let now = Date()
        for row in rows {
            let messageID = Self.messageIDPrefix + String(row.id)
            let message: DownstreamMessage
            let payload: JSONValue
            switch row.message(id: messageID, validating: true, maximumAge: settings.retry.maximumAge, now: now) {
            case .success(let prepared):
                (message, payload) = prepared
            case .failure(let refusal):
                refusal.log(rowID: row.id, to: logger, throttle: refusalWarnings)
                updates.append(OutboxUpdate(rowID: row.id, status: refusal.status, errorCode: refusal.errorCode,
                                            errorDescription: refusal.description))
                continue
            }
            ready.append(OutgoingDownstream(rowID: row.id, messageID: messageID, target: message.to ?? message.condition ?? "",
                                            targetIsToken: message.to.map { !$0.hasPrefix("/topics/") } ?? false,
                                            json: Self.wireJSON(of: message, payloadText: row.payload,
                                                        payloadHasMessageID: payload["message_id"] != nil),
                                            createdAt: row.createdAt,
                                            timeToLive: message.timeToLive, attempt: row.attempts + 1))
        }
        return (ready, updates)
    }

    /// The CCS JSON of a validated message: its id and target, then the row's payload text
    /// as PostgreSQL wrote it (valid JSON whose fields were all just checked), which
    /// spares re-serialising every message. A payload carrying its own `message_id` is
    /// serialised from the parsed message instead, so the id is never doubled.
    static func wireJSON(of message: DownstreamMessage, payloadText: String, payloadHasMessageID: Bool) -> String {
        let body = payloadText.utf8.drop { $0 == 0x20 || $0 == 0x0A || $0 == 0x09 || $0 == 0x0D }
        guard body.first == UInt8(ascii: "{"), !payloadHasMessageID else { return message.json.serialized }
        var json = "{\"message_id\":"
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
