import FCM
import Foundation
import Runtime
import Transport

/// The outbox's FCM HTTP v1 transport (`v1`): sends rows with FCM's current API, over
/// HTTP/2, authorized by a service account (`FCMV1Client`).
///
/// Claimed rows wait in a queue bounded by what the client can have in flight (its
/// connections × streams) plus as much again read ahead; as many senders as the client has
/// streams take them one at a time, so the streams stay full while PostgreSQL is claimed in
/// batches. A row is translated first (`FCMV1Message`: one request, or one per token of
/// `registration_ids`); one that cannot be is failed with the field named, unsent.
///
/// Each answer is settled (`OutboxSettlement.v1`) and written through the same write-back as
/// the other transports: the message's name (or each target's error) to `token_results`,
/// tokens FCM reports gone or of another sender marked, retries with the downstream backoff
/// no sooner than `Retry-After`. `QUOTA_EXCEEDED` holds the whole project back (no request
/// goes out, no row is claimed) until its `Retry-After` or a second. A refused grant or a
/// 403 without an FCM code (the account may not send for the project) holds v1 sending for
/// a minute, its rows waiting, said as an error; then the key file is read again (if it was
/// replaced) and sending tried again. A request whose
/// outcome is unknown (a reset stream, a broken connection) is sent again: a duplicate is
/// possible only then, never after an answer was read.
package final class V1Transport: DownstreamTransport {
    private let client: FCMV1Client
    private let recorder: OutboxRecorder
    private let settings: DownstreamSettings
    private let logger: Logger
    private let state = BlockingLock(State())
    private let failureWarnings = WarningThrottle()
    /// The longest `Retry-After` honoured.
    package static let maximumRetryAfter: Duration = .seconds(300)

    private struct State {
        var waiting = FIFO<ClaimedMessage>()
        /// Rows a sender took and has not settled yet.
        var sending = 0
        var senders = Waiters<Bool>()
        var idle = Waiters<Bool>()
        var taking = true
        /// Until when nothing is sent: the project's quota ran out (`QUOTA_EXCEEDED`), or the
        /// credentials were refused.
        var heldUntil: ContinuousClock.Instant?
    }

    package init(client: FCMV1Client, recorder: OutboxRecorder, settings: DownstreamSettings, logger: Logger) {
        self.client = client
        self.recorder = recorder
        self.settings = settings
        self.logger = logger
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
        let requests: [FCMV1Message]
        do {
            payload = try JSONValue.parse(row.payload)
            let earlier = Self.tokenResults(row.tokenResults)
            let final = row.registrationIDs == nil ? [] : Set(earlier.filter { $0.value["retry"] != .bool(true) }.keys)
            requests = try FCMV1Message.requests(target: row.sendTarget, condition: row.condition, registrationIDs: row.registrationIDs,
                                                 payload: payload, skipping: final, now: now)
        } catch {
            return .failure(.init(status: .failed, errorCode: "INVALID_MESSAGE", description: "cannot be sent over v1: \(error)"))
        }
        let timeToLive = Self.timeToLive(of: payload)
        if let refusal = row.expiryRefusal(timeToLive: timeToLive, maximumAge: maximumAge, now: now) { return .failure(refusal) }
        var message = DownstreamMessage(to: row.sendTarget ?? row.condition ?? "", messageID: "v1")
        message.timeToLive = timeToLive
        return .success(ClaimedMessage(row: row, message: message, payload: payload, v1Requests: requests))
    }

    /// A payload's time to live in seconds: the legacy `time_to_live`, or a v1 message's
    /// `android.ttl`; nil for FCM's default.
    static func timeToLive(of payload: JSONValue) -> Int? {
        if let ttl = payload["message"]?["android"]?["ttl"]?.stringValue, let seconds = Double(ttl.dropLast()) { return Int(seconds) }
        if case .number(let number)? = payload["time_to_live"], let seconds = number.int64Value { return Int(seconds) }
        return nil
    }

    /// Room in the streams, plus the read-ahead (as the XMPP transport's, per connection)
    /// less what it holds.
    package func wantedRows() -> Int {
        state.withLock { state in
            if !state.taking { return 0 }
            if let until = state.heldUntil, until > .now { return 0 }
            return max(0, client.capacity + readAhead - state.waiting.count - state.sending)
        }
    }

    /// Rows claimed ahead of the free streams.
    private var readAhead: Int { settings.readAheadPerConnection * client.connections }

    /// Claims wait until half the read-ahead is wanted: fewer, larger claim transactions
    /// (a claim's fixed cost is that of many rows).
    package var claimThreshold: Int { max(1, readAhead / 2) }
    /// It never stops for good: refused credentials hold it for a while (`holdForCredentials`).
    package var isStopped: Bool { false }

    package func tick() {
        state.withLock { state in
            if let until = state.heldUntil, until <= .now { state.heldUntil = nil }
        }
    }

    /// Queues the rows for the senders and returns.
    package func send(_ messages: [ClaimedMessage]) async {
        let waiters = state.withLock { state -> [CheckedContinuation<Bool, Never>] in
            state.waiting.append(contentsOf: messages)
            return state.senders.removeAll()
        }
        for waiter in waiters { waiter.resume(returning: true) }
    }

    /// The senders, one per stream the client has, until cancelled: each row they hold then
    /// is handed back.
    package func run() async {
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<client.capacity {
                group.addTask { await self.sendRows() }
            }
        }
    }

    /// Shutdown: the rows not yet taken are handed back at once; the ones under way get until
    /// `deadline` (or an urgent shutdown) for their answers.
    package func finish(until deadline: ContinuousClock.Instant, shutdown: ShutdownSignal) async {
        let (unsent, senders) = state.withLock { state -> ([ClaimedMessage], [CheckedContinuation<Bool, Never>]) in
            state.taking = false
            defer { state.waiting = FIFO() }
            return (state.waiting.elements, state.senders.removeAll())
        }
        for sender in senders { sender.resume(returning: false) }
        let now = Date()
        recorder.record(unsent.map { OutboxSettlement.handBack(rowID: $0.row.id, sentBefore: $0.row.attempts > 0, now: now) })
        shutdown.onUrgent { [self] in
            for waiter in state.withLock({ $0.idle.removeAll() }) { waiter.resume(returning: true) }
        }
        _ = await state.suspend(in: \.idle, cancelled: false, deadline: deadline, timedOut: false) { state in
            state.sending == 0 || shutdown.isUrgent ? true : nil
        }
    }

    // MARK: - Sending

    private func sendRows() async {
        let threshold = claimThreshold, room = client.capacity + readAhead
        while let claimed = await nextRow() {
            await send(claimed)
            let (idle, claimWanted) = state.withLock { state -> ([CheckedContinuation<Bool, Never>], Bool) in
                state.sending -= 1
                // The claim loop is rung when this row made a claim worth its while, not for
                // every row.
                let wanted = room - state.waiting.count - state.sending
                return (state.sending == 0 ? state.idle.removeAll() : [], wanted >= threshold && (wanted == threshold || state.sending == 0))
            }
            for waiter in idle { waiter.resume(returning: true) }
            if claimWanted { recorder.doorbell.ring() }
        }
    }

    /// The next row to send, or nil once cancelled or finishing.
    private func nextRow() async -> ClaimedMessage? {
        while !Task.isCancelled {
            enum Next { case row(ClaimedMessage), done, wait }
            let next = state.withLock { state -> Next in
                guard state.taking else { return .done }
                guard let row = state.waiting.popFirst() else { return .wait }
                state.sending += 1
                return .row(row)
            }
            switch next {
            case .row(let row): return row
            case .done: return nil
            case .wait:
                let more = await state.suspend(in: \.senders, cancelled: false) { state in
                    !state.taking ? false : (state.waiting.isEmpty ? nil : true)
                }
                if !more { return nil }
            }
        }
        return nil
    }

    private func send(_ claimed: ClaimedMessage) async {
        let row = claimed.row
        let now = Date()
        if let until = state.withLock({ $0.heldUntil }), until > .now {
            // Held back: not sent, not counted as an attempt.
            recorder.record([OutboxUpdate(rowID: row.id, status: row.attempts > 0 ? .retry : .pending,
                                          availableAt: now.addingTimeInterval((until - .now).seconds))])
            return
        }
        let earlier = row.tokenResults == nil ? [:] : Self.tokenResults(row.tokenResults)
        let requests = claimed.v1Requests
        var outcomes: [(target: String, isDevice: Bool, outcome: OutboxSettlement.V1Outcome)] = []
        if requests.count == 1 {
            // The usual row: no task group.
            if let outcome = await attempt(requests[0]) { outcomes.append(outcome) }
        } else {
            outcomes = await withTaskGroup(of: (String, Bool, OutboxSettlement.V1Outcome)?.self) { group in
                for request in requests {
                    group.addTask { await self.attempt(request) }
                }
                return await group.reduce(into: [(target: String, isDevice: Bool, outcome: OutboxSettlement.V1Outcome)]()) { list, item in
                    if let item { list.append((item.0, item.1, item.2)) }
                }
            }
        }
        if outcomes.count < requests.count {
            // Cancelled (shutdown), or the credentials were refused: the row goes back whole,
            // due when sending resumes (a retry: whether FCM took what went out is unknown).
            let resumes = state.withLock { $0.heldUntil }.map { $0 > .now ? Date().addingTimeInterval(($0 - .now).seconds) : Date() } ?? Date()
            recorder.record([OutboxUpdate(rowID: row.id, status: .retry, availableAt: resumes)])
            return
        }
        var generator = SystemRandomGenerator()
        let settlement = OutboxSettlement.v1(outcomes, earlier: earlier, rowID: row.id, attempt: row.attempts + 1,
                                             age: .seconds(now.timeIntervalSince(row.createdAt)), timeToLive: claimed.message.timeToLive,
                                             policy: settings.retry, maximumRetryAfter: Self.maximumRetryAfter, sentAt: now, now: Date(),
                                             using: &generator)
        if let update = settlement.update { recorder.record([update], tokens: settlement.tokens) }
    }

    /// One request: its target's outcome, or nil when it must be handed back unanswered
    /// (cancelled, or the credentials were refused).
    private func attempt(_ request: FCMV1Message) async -> (String, Bool, OutboxSettlement.V1Outcome)? {
        let answer: FCMV1Answer
        do {
            answer = try await client.send(request)
        } catch {
            switch error {
            case .transport(.cancelled):
                return nil
            case .credentials(.refused(let reason)):
                holdForCredentials("the token endpoint refused the service account's grant: \(reason)")
                return nil
            case .credentials(.unreachable):
                warn(error, kind: "token")
                return (request.target, request.targetIsDevice, .unanswered(code: "TOKEN_UNAVAILABLE", description: "\(error)"))
            case .transport(let transport):
                warn(error, kind: transport.isOutcomeUnknown ? "unknown" : "transport")
                return (request.target, request.targetIsDevice,
                        .unanswered(code: transport.isOutcomeUnknown ? "OUTCOME_UNKNOWN" : "V1_UNAVAILABLE", description: "\(error)"))
            }
        }
        switch answer {
        case .sent(let name):
            return (request.target, request.targetIsDevice, .sent(name: name))
        case .refused(let error):
            switch error.action {
            case .stopSending:
                holdForCredentials("FCM refused the service account for project \(client.projectID): \(error)")
                return nil
            case .slowDownProject:
                holdProject(retryAfter: error.retryAfter)
            case .refreshToken:
                warn(.credentials(.refused("\(error)")), kind: "unauthenticated")
            case .retry:
                warn(.transport(.connectionLost("\(error)")), kind: "unavailable")
            case .fail, .failAndMarkToken:
                break
            }
            return (request.target, request.targetIsDevice, .refused(error))
        }
    }

    /// `QUOTA_EXCEEDED`: nothing goes out until `Retry-After` (capped), or a second if none.
    private func holdProject(retryAfter: Duration?) {
        let wait = min(retryAfter ?? .seconds(1), Self.maximumRetryAfter)
        let first = state.withLock { state -> Bool in
            let until = ContinuousClock.now + wait
            defer { state.heldUntil = max(state.heldUntil ?? until, until) }
            return state.heldUntil == nil
        }
        if first { logger.warning("FCM's quota for project \(client.projectID) is exceeded: v1 sending pauses for \(wait.formattedSeconds)") }
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
