import FCM
import Foundation
import Runtime
import Synchronization
import Transport

/// The outbox's FCM HTTP v1 transport (`v1`): sends rows with FCM's current API, over
/// HTTP/2, authorized by a service account (`FCMV1Client`).
///
/// A claimed row is translated first (`prepare`: one request, or one per token of
/// `registration_ids`); one that cannot be is failed with the field named, unsent. Its
/// requests are submitted at once, without a task each: the HTTP/2 client multiplexes them
/// over its connections' streams (those beyond its streams wait in its queue), and each
/// answer is settled on the connection's thread. What it holds is bounded by the claim
/// loop: the client's streams plus the read-ahead of the XMPP transport per connection.
///
/// Each answer is settled (`OutboxSettlement.v1`) and written through the same write-back as
/// the other transports: the message's name to `message_name` (a fan-out's, per token, to
/// `token_results`), tokens FCM reports gone or malformed marked, retries with the
/// downstream backoff no sooner than `Retry-After`. An access token FCM refuses is replaced
/// and the request submitted once more (`run` does that).
///
/// What FCM's rules ask of a sender in production (docs/protocol.md's v1 section):
/// - **Quota.** A project's `QUOTA_EXCEEDED` pauses every v1 send (from a minute, doubling,
///   `Retry-After` when longer) and then paces sending (`QuotaPacer`); a device's or a
///   topic's holds only the rows to that target.
/// - **`SENDER_ID_MISMATCH`** fails the row and keeps its token; when many distinct tokens
///   get it (`SenderMismatchWatch`) the credentials send for the wrong project: sending
///   stops, said once as an error and in a metric, rows wait, until the key file changes or
///   the worker gets SIGHUP (`reloads`).
/// - **Credentials.** A refused grant or a 403 without an FCM code holds v1 sending for a
///   minute, its rows waiting, said as an error; then the key file is read again and sending
///   tried again. A token endpoint that cannot be reached holds sending with backoff (1 s
///   doubling to a minute); its rows go back without an attempt counted, as nothing was sent.
///
/// A request whose outcome is unknown (a reset stream, a broken connection) is sent again: a
/// duplicate is possible only then, never after an answer was read.
package final class V1Transport: DownstreamTransport {
    private let client: FCMV1Client
    private let recorder: OutboxRecorder
    private let settings: DownstreamSettings
    private let logger: Logger
    private let state = BlockingLock(State(pacer: QuotaPacer()))
    private let failureWarnings = WarningThrottle()
    /// Requests whose access token FCM refused, for `run` to submit again with a new one.
    private let refreshes = BlockingLock([(request: V1Request, row: RowProgress, token: String)]())
    private let refreshDoorbell = Doorbell()
    private let metrics: (any OutboxMetrics)?
    /// Raised (SIGHUP) to resume sending stopped for a sender mismatch.
    private let reloads: ReloadGeneration
    /// The longest `Retry-After` honoured.
    package static let maximumRetryAfter: Duration = .seconds(300)

    private struct State {
        /// Rows it holds: waiting, or submitted and not settled yet.
        var sending = 0
        /// Rows waiting for a stream, with the access token they go with: a row is submitted
        /// when one of the client's streams is (nearly) free, so that its `sent_at` is about
        /// when it went out.
        var waiting = FIFO<(claimed: ClaimedMessage, token: String)>()
        /// Rows submitted and not settled yet (at most the client's streams and a quarter).
        var submitted = 0
        var idle = Waiters<Bool>()
        var taking = true
        /// Until when nothing is sent or claimed: the credentials were refused, or the token
        /// endpoint cannot be reached.
        var heldUntil: ContinuousClock.Instant?
        /// Token-endpoint outages in a row (their holds grow).
        var tokenOutages = 0
        /// The project's quota: its pause and the pacing after it.
        var pacer: QuotaPacer
        /// Devices and topics whose own rate FCM refused, until when.
        var targetPauses: [String: ContinuousClock.Instant] = [:]
        var mismatchWatch = SenderMismatchWatch()
        /// Set while sending is stopped for a sender mismatch: the credentials then.
        var mismatchStop: (account: String, reload: Int)?
    }

    /// One row's requests under way and the outcomes so far.
    private final class RowProgress: Sendable {
        let claimed: ClaimedMessage
        let sentAt: Date
        /// Inline in the object (one allocation a row, not three: a row is settled on a
        /// connection's thread per answer).
        private let outcomes: Mutex<(list: [(target: String, isDevice: Bool, outcome: OutboxSettlement.V1Outcome)], remaining: Int, handBack: Bool,
                                     handBackCode: String?)>

        init(_ claimed: ClaimedMessage, sentAt: Date) {
            self.claimed = claimed
            self.sentAt = sentAt
            outcomes = Mutex(([], claimed.v1Requests.count, false, nil))
        }

        /// Adds a request's outcome (nil: it must go back unanswered, `code` saying why FCM
        /// refused it if it did); returns the row's outcomes once it was the last, whether
        /// the row goes back, and why.
        func add(_ outcome: (target: String, isDevice: Bool, outcome: OutboxSettlement.V1Outcome)?, code: String? = nil)
            -> (list: [(target: String, isDevice: Bool, outcome: OutboxSettlement.V1Outcome)], handBack: Bool, code: String?)? {
            outcomes.withLock { state in
                if let outcome { state.list.append(outcome) } else { state.handBack = true }
                if let code { state.handBackCode = code }
                state.remaining -= 1
                return state.remaining == 0 ? (state.list, state.handBack, state.handBackCode) : nil
            }
        }
    }

    package init(client: FCMV1Client, recorder: OutboxRecorder, settings: DownstreamSettings, logger: Logger,
                 metrics: (any OutboxMetrics)? = nil, reloads: ReloadGeneration = ReloadGeneration()) {
        self.client = client
        self.recorder = recorder
        self.settings = settings
        self.logger = logger
        self.metrics = metrics
        self.reloads = reloads
        state.withLock { $0.pacer = QuotaPacer(initialPause: settings.v1QuotaPause, window: settings.v1QuotaWindow) }
    }

    package var name: String { "v1" }
    /// Rows are checked as they are translated (`prepare`).
    package var validatesRows: Bool { false }
    package func messageID(forRow id: Int64) -> String { "v1" }

    /// Translates the row (`FCMV1Message.requests`: one request, or one per token of a
    /// multicast not answered for good before) and applies the rules of every transport: a
    /// token FCM refused before, a time to live or retry age that passed. A row that cannot
    /// be translated is failed with the field named, unsent.
    package func prepare(_ row: OutboxStore.ClaimedRow, maximumAge: Duration, now: Date) -> Result<ClaimedMessage, OutboxStore.ClaimedRow.Refusal> {
        if let refusal = row.markedTokenRefusal { return .failure(refusal) }
        let payload: JSONValue
        let requests: [V1Request]
        do {
            payload = try JSONValue.parse(row.payload)
            let final = row.registrationIDs == nil ? []
                : Set(Self.tokenResults(row.tokenResults).filter { $0.value["retry"] != .bool(true) }.keys)
            requests = try FCMV1Message.requests(target: row.sendTarget, condition: row.condition, registrationIDs: row.registrationIDs,
                                                 payload: payload, skipping: final, queuedAt: row.createdAt, now: now).map(V1Request.init)
        } catch {
            return .failure(.init(status: .failed, errorCode: "INVALID_MESSAGE", description: "cannot be sent over v1: \(error)"))
        }
        let timeToLive = Self.timeToLive(of: payload)
        if let refusal = row.expiryRefusal(timeToLive: timeToLive, maximumAge: maximumAge, now: now) { return .failure(refusal) }
        var message = DownstreamMessage(to: row.sendTarget ?? row.condition ?? "", messageID: "v1")
        message.timeToLive = timeToLive
        return .success(ClaimedMessage(row: row, message: message, payloadHasMessageID: false, v1Requests: requests))
    }

    /// A payload's time to live in seconds: the legacy `time_to_live`, or a v1 message's
    /// `android.ttl`; nil for FCM's default.
    static func timeToLive(of payload: JSONValue) -> Int? {
        if let ttl = payload["message"]?["android"]?["ttl"]?.stringValue, let seconds = Double(ttl.dropLast()) { return Int(seconds) }
        if case .number(let number)? = payload["time_to_live"], let seconds = number.int64Value { return Int(seconds) }
        return nil
    }

    /// Room in the streams, plus the read-ahead (as the XMPP transport's, per connection),
    /// less what it holds.
    package func wantedRows() -> Int {
        state.withLock { state in
            if !state.taking || state.mismatchStop != nil { return 0 }
            if let until = state.heldUntil, until > .now { return 0 }
            if let until = state.pacer.pausedUntil, until > .now { return 0 }
            return max(0, room - state.sending)
        }
    }

    /// The rows it may hold: the streams plus the read-ahead.
    private var room: Int { client.capacity + readAhead }

    /// Rows claimed ahead of the free streams.
    private var readAhead: Int { settings.readAheadPerConnection * client.connections }

    /// Claims wait until half the read-ahead is wanted: fewer, larger claim transactions
    /// (a claim's fixed cost is that of many rows).
    package var claimThreshold: Int { max(1, readAhead / 2) }

    /// It never stops for good: refused credentials hold it for a while (`holdForCredentials`).
    package var isStopped: Bool { false }

    /// Whether sending goes on now: false while stopped for a sender mismatch or held for
    /// refused credentials or a token endpoint that cannot be reached.
    package var canSend: Bool {
        state.withLock { state in
            state.mismatchStop == nil && !(state.heldUntil.map { $0 > .now } ?? false)
        }
    }

    package func tick() {
        let now = ContinuousClock.now
        state.withLock { state in
            if let until = state.heldUntil, until <= now { state.heldUntil = nil }
            if state.targetPauses.count > 0 { state.targetPauses = state.targetPauses.filter { $0.value > now } }
        }
        resumeIfCredentialsChanged()
    }

    /// The credentials' identity: what a sender mismatch is blamed on.
    private func credentialsIdentity() -> String {
        let account = client.tokens.currentAccount()
        return "\(account?.clientEmail ?? "?") \(account?.privateKeyID ?? "?") \(account?.projectID ?? "?") \(client.projectID)"
    }

    /// Sending stopped for a sender mismatch resumes once the key file names other
    /// credentials or SIGHUP came.
    private func resumeIfCredentialsChanged() {
        guard let stop = state.withLock({ $0.mismatchStop }) else { return }
        let reload = reloads.value
        let identity = credentialsIdentity()
        guard reload != stop.reload || identity != stop.account else { return }
        state.withLock { state in
            state.mismatchStop = nil
            state.mismatchWatch.reset()
        }
        client.tokens.invalidateAll()
        metrics?.v1SendingStopped(false)
        logger.notice("v1 sending resumes: \(reload != stop.reload ? "SIGHUP received" : "the service-account key file changed") "
                      + "(project \(client.projectID))")
        recorder.doorbell.ring()
    }

    /// Submits the rows' requests with the current access token and returns.
    package func send(_ messages: [ClaimedMessage]) async {
        let resumes = state.withLock { state -> Date? in
            let now = ContinuousClock.now
            if state.mismatchStop != nil { return Date() }
            guard let until = state.heldUntil, until > now else { return nil }
            return Date().addingTimeInterval((until - now).seconds)
        }
        if let resumes {
            // Held back: not sent, not counted as an attempt.
            putBack(messages, until: resumes)
            return
        }
        state.withLock { $0.sending += messages.count }
        let token: String
        do {
            token = try await client.tokens.token()
            state.withLock { $0.tokenOutages = 0 }
        } catch {
            // Nothing went out: the rows go back whole, no attempt counted.
            let until: Date
            switch error as? AccessTokenSource.Failure {
            case .refused(let reason)?:
                holdForCredentials("the token endpoint refused the service account's grant: \(reason)")
                until = heldUntilDate()
            case .unreachable(let reason)?:
                until = holdForTokenOutage(reason)
            case nil:
                until = Date()
            }
            putBack(messages, until: until)
            let idle = state.withLock { state -> [CheckedContinuation<Bool, Never>] in
                state.sending -= messages.count
                return state.sending == 0 ? state.idle.removeAll() : []
            }
            for waiter in idle { waiter.resume(returning: true) }
            return
        }
        state.withLock { state in
            for claimed in messages { state.waiting.append((claimed, token)) }
        }
        startWaiting()
    }

    /// Rows not sent go back, due at `until`, with no attempt counted.
    private func putBack(_ messages: [ClaimedMessage], until: Date) {
        guard !messages.isEmpty else { return }
        recorder.record(messages.map { OutboxUpdate(rowID: $0.row.id, status: $0.row.attempts > 0 ? .retry : .pending, availableAt: until) })
    }

    /// When the credentials' hold ends, as a date (now when none).
    private func heldUntilDate() -> Date {
        let until = state.withLock { $0.heldUntil }
        guard let until, until > .now else { return Date() }
        return Date().addingTimeInterval((until - .now).seconds)
    }

    /// The token endpoint cannot be reached (after the token source's own tries): v1
    /// sending holds for 1 s, doubling with each outage in a row to a minute; said once a
    /// minute.
    private func holdForTokenOutage(_ reason: String) -> Date {
        let wait = state.withLock { state -> Duration in
            let wait = min(Self.credentialsHold, .seconds(1) * Double(1 << min(state.tokenOutages, 6)))
            state.tokenOutages += 1
            let until = ContinuousClock.now + wait
            state.heldUntil = max(state.heldUntil ?? until, until)
            return wait
        }
        warn(.credentials(.unreachable(reason)), kind: "token")
        return Date().addingTimeInterval(wait.seconds)
    }

    /// Submits waiting rows while the client has free streams, and a quarter as many more
    /// (queued in the client, they fill a stream the moment it frees, a few milliseconds
    /// after they were counted as sent), as fast as the quota's pacing admits. A row to a
    /// device or topic whose own rate FCM refused goes back until that pause ends.
    private func startWaiting() {
        let capacity = client.capacity + client.capacity / 4
        enum Next { case submit(ClaimedMessage, String), putBack(ClaimedMessage, ContinuousClock.Instant) }
        while let next = state.withLock({ state -> Next? in
            guard state.submitted < capacity, let first = state.waiting.first else { return nil }
            if !state.targetPauses.isEmpty || state.pacer.isSlowed {
                let now = ContinuousClock.now
                if first.claimed.v1Requests.count == 1, let until = state.targetPauses[first.claimed.v1Requests[0].target], until > now {
                    _ = state.waiting.popFirst()
                    state.sending -= 1
                    return .putBack(first.claimed, until)
                }
                guard state.pacer.admit(at: now) else { return nil }
            }
            _ = state.waiting.popFirst()
            state.submitted += 1
            return .submit(first.claimed, first.token)
        }) {
            switch next {
            case .putBack(let claimed, let until):
                putBack([claimed], until: Date().addingTimeInterval((until - .now).seconds))
            case .submit(let claimed, let token):
                let progress = RowProgress(claimed, sentAt: Date())
                // A multicast whose tokens all have their final answer already is settled as it is.
                if claimed.v1Requests.isEmpty { settle(progress, outcomes: [], handBack: false) }
                for request in claimed.v1Requests { submit(request, for: progress, token: token, refreshed: false) }
            }
        }
    }

    /// Submits the access-token refreshes' requests again, until cancelled.
    package func run() async {
        while !Task.isCancelled {
            // Wakes when the pacing admits the next waiting row, at the latest in a second.
            let now = ContinuousClock.now
            let paced = state.withLock { $0.waiting.isEmpty ? nil : $0.pacer.nextAdmission(at: now) }
            await refreshDoorbell.wait(timeout: paced.map { max(.milliseconds(1), min(.seconds(1), $0 - now)) } ?? .seconds(1))
            startWaiting()
            resumeIfCredentialsChanged()
            let waiting = refreshes.withLock { list -> [(request: V1Request, row: RowProgress, token: String)] in
                defer { list.removeAll() }
                return list
            }
            guard !waiting.isEmpty else { continue }
            for token in Set(waiting.map(\.token)) { client.tokens.invalidate(token) }
            let fresh: String
            do {
                fresh = try await client.tokens.token()
            } catch {
                if case .refused(let reason)? = error as? AccessTokenSource.Failure {
                    holdForCredentials("the token endpoint refused the service account's grant: \(reason)")
                }
                for (_, row, _) in waiting { finished(row, with: nil) }
                continue
            }
            for (request, row, _) in waiting { submit(request, for: row, token: fresh, refreshed: true) }
        }
        // Cancelled with refreshes waiting: their rows go back.
        let left = refreshes.withLock { list -> [RowProgress] in
            defer { list.removeAll() }
            return list.map(\.row)
        }
        for row in left { finished(row, with: nil) }
    }

    /// Shutdown: sending stops first (rows waiting here or in the client for a stream go
    /// back unsent, claimable at once, no attempt counted); the requests under way get until
    /// `deadline` (or an urgent shutdown) for their answers; then those still unanswered are
    /// cancelled and their rows handed back (FCM may have taken them: the one case a
    /// graceful shutdown sends a row twice).
    package func finish(until deadline: ContinuousClock.Instant, shutdown: ShutdownSignal) async {
        let unsent = state.withLock { state -> [ClaimedMessage] in
            state.taking = false
            defer {
                state.sending -= state.waiting.count
                state.waiting = FIFO()
            }
            return state.waiting.elements.map(\.claimed)
        }
        // Not sent: claimable again at once.
        let now = Date()
        recorder.record(unsent.map { OutboxSettlement.handBack(rowID: $0.row.id, sentBefore: $0.row.attempts > 0, now: now) })
        // Nothing more goes out: what the client holds unsent ends cancelled (handed back).
        client.cancelUnsent()
        shutdown.onUrgent { [self] in
            for waiter in state.withLock({ $0.idle.removeAll() }) { waiter.resume(returning: true) }
        }
        _ = await state.suspend(in: \.idle, cancelled: false, deadline: deadline, timedOut: false) { state in
            state.sending == 0 || shutdown.isUrgent ? true : nil
        }
        client.cancelAll()
        // The cancelled requests' completions run on the connections' threads at once.
        _ = await state.suspend(in: \.idle, cancelled: false, deadline: .now + .seconds(1), timedOut: false) { state in
            state.sending == 0 ? true : nil
        }
    }

    // MARK: - Sending

    private func submit(_ request: V1Request, for row: RowProgress, token: String, refreshed: Bool) {
        client.submit(body: request.body, token: token) { [self] result in
            answered(request, result, for: row, token: token, refreshed: refreshed)
        }
    }

    /// One request's answer (on a connection's thread).
    private func answered(_ request: V1Request, _ result: Result<FCMV1Answer, FCMV1Client.Failure>, for row: RowProgress,
                          token: String, refreshed: Bool) {
        let answer: FCMV1Answer
        switch result {
        case .failure(.transport(.cancelled)), .failure(.credentials):
            return finished(row, with: nil)
        case .failure(.transport(let error)):
            let failure = FCMV1Client.Failure.transport(error)
            warn(failure, kind: error.isOutcomeUnknown ? "unknown" : "transport")
            return finished(row, with: (request.target, request.targetIsDevice,
                                        .unanswered(code: error.isOutcomeUnknown ? "OUTCOME_UNKNOWN" : "V1_UNAVAILABLE", description: "\(failure)")))
        case .success(let value):
            answer = value
        }
        switch answer {
        case .sent(let name):
            finished(row, with: (request.target, request.targetIsDevice, .sent(name: name)))
        case .refused(let error):
            switch error.action {
            case .refreshToken where !refreshed:
                // FCM did not process it: sent again once with a new token.
                refreshes.withLock { $0.append((request, row, token)) }
                refreshDoorbell.ring()
                return
            case .stopSending:
                holdForCredentials("FCM refused the service account for project \(client.projectID): \(error)")
                return finished(row, with: nil, code: error.code)
            case .slowDownProject:
                holdProject(retryAfter: error.retryAfter)
            case .slowDownTarget:
                holdTarget(request.target, scope: error.quotaScope ?? .device, retryAfter: error.retryAfter)
            case .failForSenderMismatch where state.withLock({ $0.mismatchStop != nil }):
                // The credentials are wrong, not the token: the row waits for them to change.
                return finished(row, with: nil, code: error.code)
            case .failForSenderMismatch:
                break
            case .refreshToken:
                warn(.credentials(.refused("\(error)")), kind: "unauthenticated")
            case .retry:
                warn(.transport(.connectionLost("\(error)")), kind: "unavailable")
            case .fail, .failAndMarkToken:
                break
            }
            finished(row, with: (request.target, request.targetIsDevice, .refused(error)))
        }
    }

    /// Adds a request's outcome to its row; the row's last settles it.
    private func finished(_ row: RowProgress, with outcome: (target: String, isDevice: Bool, outcome: OutboxSettlement.V1Outcome)?,
                          code: String? = nil) {
        guard let (outcomes, handBack, code) = row.add(outcome, code: code) else { return }
        settle(row, outcomes: outcomes, handBack: handBack, code: code)
    }

    /// Records a row's settlement (or hands it back), and counts it out.
    private func settle(_ row: RowProgress, outcomes: [(target: String, isDevice: Bool, outcome: OutboxSettlement.V1Outcome)], handBack: Bool,
                        code: String? = nil) {
        let claimed = row.claimed
        if handBack {
            // Cancelled (shutdown), or the credentials were refused: the row goes back whole,
            // due when sending resumes (a retry: whether FCM took what went out is unknown).
            // FCM's code, when it refused the credentials, is kept on the row and counted.
            recorder.record([OutboxUpdate(rowID: claimed.row.id, status: .retry, errorCode: code, availableAt: heldUntilDate())])
        } else {
            var generator = SystemRandomGenerator()
            let fanOut = claimed.row.registrationIDs != nil
            let settlement = OutboxSettlement.v1(outcomes, fanOut: fanOut, notBefore: notBefore(outcomes),
                                                 earlier: fanOut ? Self.tokenResults(claimed.row.tokenResults) : [:],
                                                 rowID: claimed.row.id, attempt: claimed.row.attempts + 1,
                                                 age: .seconds(row.sentAt.timeIntervalSince(claimed.row.createdAt)),
                                                 timeToLive: claimed.message.timeToLive, policy: settings.retry,
                                                 maximumRetryAfter: Self.maximumRetryAfter, sentAt: row.sentAt, now: Date(), using: &generator)
            if let update = settlement.update { recorder.record([update], tokens: settlement.tokens) }
        }
        // Answers count toward the quota's rate and the sender-mismatch rule (in the lock this
        // row takes anyway, not one more per answer).
        let now = outcomes.isEmpty ? nil : ContinuousClock.now
        let (idle, claimWanted, mismatchFired) = state.withLock { state -> ([CheckedContinuation<Bool, Never>], Bool, Bool) in
            var fired = false
            if let now { fired = Self.count(outcomes, at: now, in: &state) }
            state.sending -= 1
            state.submitted -= 1
            // The claim loop is rung when this row made a claim worth its while, not for
            // every row.
            let wanted = room - state.sending
            return (state.sending == 0 ? state.idle.removeAll() : [], wanted >= claimThreshold && (wanted == claimThreshold || state.sending == 0),
                    fired)
        }
        for waiter in idle { waiter.resume(returning: true) }
        if mismatchFired { stopForSenderMismatch() }
        if claimWanted { recorder.doorbell.ring() }
        startWaiting()
    }

    /// Counts a row's answers: each one FCM counted against the quota (every answer but a
    /// quota refusal: FCM counts client errors too), and each device answer for the
    /// sender-mismatch rule. True when the rule fired now.
    private static func count(_ outcomes: [(target: String, isDevice: Bool, outcome: OutboxSettlement.V1Outcome)],
                              at now: ContinuousClock.Instant, in state: inout State) -> Bool {
        var fired = false
        for (target, isDevice, outcome) in outcomes {
            let mismatch: Bool
            switch outcome {
            case .sent: mismatch = false
            case .refused(let error) where !error.isQuota: mismatch = error.action == .failForSenderMismatch
            case .refused, .unanswered: continue
            }
            state.pacer.accepted(at: now)
            if isDevice, state.mismatchStop == nil, state.mismatchWatch.record(token: target, mismatch: mismatch, at: now) { fired = true }
        }
        return fired
    }

    /// The project's quota ran out: nothing goes out for the pacer's pause (a minute,
    /// doubling, `Retry-After` when longer), then sending resumes paced.
    private func holdProject(retryAfter: Duration?) {
        let wait = state.withLock { $0.pacer.pause(retryAfter: retryAfter, at: .now, random: Double.random(in: 0...1)) }
        if let wait {
            logger.warning("FCM's quota for project \(client.projectID) is exceeded: v1 sending pauses for \(wait.formattedSeconds), "
                           + "then resumes paced at the rate FCM accepted")
        }
    }

    /// A device's or a topic's own rate was exceeded: rows to it wait (a device
    /// `Retry-After` or the retry base, a topic as long as a project pause), the others go on.
    private func holdTarget(_ target: String, scope: FCMV1Error.QuotaScope, retryAfter: Duration?) {
        let minimum = scope == .topic ? settings.v1QuotaPause : settings.retry.base
        let wait = min(Self.maximumRetryAfter, max(minimum, retryAfter ?? .zero))
        state.withLock { state in
            let until = ContinuousClock.now + wait
            state.targetPauses[target] = max(state.targetPauses[target] ?? until, until)
        }
    }

    /// The earliest a row whose answers included a quota refusal may go again: the end of
    /// the project's pause or of its target's.
    private func notBefore(_ outcomes: [(target: String, isDevice: Bool, outcome: OutboxSettlement.V1Outcome)]) -> Date? {
        func isQuota(_ outcome: OutboxSettlement.V1Outcome) -> Bool {
            if case .refused(let error) = outcome { return error.isQuota } else { return false }
        }
        guard outcomes.contains(where: { isQuota($0.outcome) }) else { return nil }
        let quota = outcomes.filter { isQuota($0.outcome) }
        let now = ContinuousClock.now
        let latest = state.withLock { state -> ContinuousClock.Instant? in
            ([state.pacer.pausedUntil] + quota.map { state.targetPauses[$0.target] }).compactMap { $0 }.max()
        }
        guard let latest, latest > now else { return nil }
        return Date().addingTimeInterval((latest - now).seconds)
    }

    /// The sender-mismatch rule fired: v1 sending stops until the credentials change.
    private func stopForSenderMismatch() {
        let identity = credentialsIdentity()
        let waiting = state.withLock { state -> [ClaimedMessage]? in
            guard state.mismatchStop == nil else { return nil }
            state.mismatchStop = (identity, reloads.value)
            defer {
                state.sending -= state.waiting.count
                state.waiting = FIFO()
            }
            return state.waiting.elements.map(\.claimed)
        }
        guard let waiting else { return }
        putBack(waiting, until: Date())
        metrics?.v1SendingStopped(true)
        let watch = SenderMismatchWatch()
        logger.error("FCM answered SENDER_ID_MISMATCH for \(watch.distinctTokens) or more distinct tokens within "
                     + "\(watch.window.formattedSeconds), most of its answers: the credentials (\(client.tokens.account)) send for project "
                     + "\(client.projectID), not the one these tokens' app belongs to. v1 sending stopped; rows with transport v1 wait "
                     + "(their tokens are kept). Check --project-id and the key file's project_id against the app's Firebase project; "
                     + "sending resumes when the key file changes or on SIGHUP")
    }

    /// Refused credentials (a revoked key, an account without the permission to send for
    /// the project): nothing is sent for `credentialsHold`, then the key file is read again
    /// and sending tried again; said as an error once a minute. A fixed key, a replaced file
    /// or a granted permission resumes sending without a restart.
    private func holdForCredentials(_ reason: String) {
        state.withLock { state in
            let until = ContinuousClock.now + Self.credentialsHold
            state.heldUntil = max(state.heldUntil ?? until, until)
        }
        guard let leftOut = failureWarnings.admit("credentials") else { return }
        let since = leftOut > 0 ? " (\(leftOut) more since the last line)" : ""
        logger.error("\(reason)\(since): v1 sending pauses for \(Self.credentialsHold.formattedSeconds) and is tried again "
                     + "(the key file is read again if it changed); rows with transport v1 wait")
    }

    /// How long refused credentials hold v1 sending.
    package static let credentialsHold: Duration = .seconds(60)

    /// Logs failed requests once a minute per kind.
    private func warn(_ failure: FCMV1Client.Failure, kind: String) {
        guard let leftOut = failureWarnings.admit(kind) else { return }
        let since = leftOut > 0 ? " (\(leftOut) more since the last line)" : ""
        switch failure {
        case .transport(.certificateRejected), .transport(.resolutionFailed):
            logger.error("v1 requests to FCM fail: \(failure)\(since): check --v1-endpoint and --ca-file")
        default:
            logger.warning("v1 requests to FCM fail: \(failure)\(since); rows with transport v1 are retried with backoff")
        }
    }

    private static func tokenResults(_ text: String?) -> [String: JSONValue] {
        guard let text, case .object(let members)? = try? JSONValue.parse(text) else { return [:] }
        return members
    }
}
