import FCM
import Foundation
import Postgres
import Runtime

/// The outbox's legacy HTTP transport (`http`): sends rows through FCM's legacy HTTP
/// protocol. Rows with `registration_ids` go out as multicasts (1,000 tokens per request),
/// the others to their `target` or `condition`; it takes 8 rows at a time and sends them at
/// once (the client keeps at most 4 requests in flight).
///
/// Each attempt is settled like an XMPP answer (`OutboxSettlement.http`) and written
/// through the same write-back: every token's outcome goes to the row's `token_results`,
/// tokens FCM reports bad or replaced are marked in `device_tokens`, only tokens marked
/// for retry are sent again, and a rate-limited target holds its rows back. A 5xx answer
/// or a failed connection retries the row with the downstream backoff, no sooner than a
/// `Retry-After` (capped at `maximumRetryAfter`); a 401 stops HTTP sending until the
/// worker restarts (a configuration error, never retried in a loop).
package final class LegacyHTTPTransport: DownstreamTransport {
    private let client: FCMHTTPClient
    private let recorder: OutboxRecorder
    private let settings: DownstreamSettings
    private let logger: Logger
    private let state = BlockingLock(State())
    /// One line a minute per kind of failed request (an unknown host, a refused
    /// certificate, 5xx answers): the rows retry quietly otherwise.
    private let failureWarnings = WarningThrottle()
    /// Rows taken at once (each may be a multicast of several requests).
    private let batch = 8
    /// The longest `Retry-After` honoured: FCM's answer holds a row back at most this long.
    package static let maximumRetryAfter: Duration = .seconds(300)

    private struct State {
        package var refused = false
        /// Devices and topics that hit a rate limit, and until when their rows wait.
        package var slowDowns = SlowDowns()
    }

    package init(client: FCMHTTPClient, recorder: OutboxRecorder, settings: DownstreamSettings, logger: Logger) {
        self.client = client
        self.recorder = recorder
        self.settings = settings
        self.logger = logger
    }

    package var name: String { "http" }
    /// The client checks each request against FCM's rules itself.
    package var validatesRows: Bool { false }
    package func messageID(forRow id: Int64) -> String { "http" }
    package func wantedRows() -> Int { batch }
    package var claimThreshold: Int { 1 }
    package var isStopped: Bool { state.withLock { $0.refused } }
    package func tick() {}

    /// Sends the rows at once and returns when each is answered (or, cancelled, handed back).
    package func send(_ messages: [ClaimedMessage]) async {
        await withTaskGroup(of: Void.self) { group in
            for claimed in messages { group.addTask { await self.send(claimed.row, message: claimed.message) } }
        }
    }

    /// Nothing waits here: the requests under way are the claim loop's `send`, which the
    /// outbox gives until the deadline and then cancels.
    package func finish(until deadline: ContinuousClock.Instant, shutdown: ShutdownSignal) async {}

    /// Hands row updates to the write-back, counted for metrics.
    private func record(_ updates: [OutboxUpdate], tokens: [TokenMark] = []) {
        recorder.record(updates, tokens: tokens)
    }

    private func send(_ row: OutboxStore.ClaimedRow, message: DownstreamMessage) async {
        let now = Date()
        if let target = message.to ?? message.condition,
           let until = state.withLock({ $0.slowDowns.heldUntil(target, now: .now) }) {
            // Held back like XMPP's rate-limit slowdown: not sent, not counted as an attempt.
            record([OutboxUpdate(rowID: row.id, status: row.attempts > 0 ? .retry : .pending,
                                           availableAt: now.addingTimeInterval((until - .now).seconds))])
            return
        }
        var request = LegacyHTTPMessage(target: .to(""))
        request.options = message
        let earlier = Self.tokenResults(row.tokenResults)
        var outcome: [(token: String, result: LegacyHTTPResponse.Result)] = []
        var failure: FCMHTTPClient.Failure?
        if let registrationIDs = row.registrationIDs {
            guard !registrationIDs.isEmpty else {
                record([OutboxUpdate(rowID: row.id, status: .failed, errorCode: "INVALID_MESSAGE",
                                               errorDescription: "invalid downstream message: registration_ids is empty")])
                return
            }
            let tokens = registrationIDs.filter { earlier[$0].map { !Self.isFinal($0) } ?? true }
            request.target = .registrationIDs(tokens)
            let multicast = await client.sendMulticast(request, to: tokens, retrying: false)
            if multicast.results.isEmpty, let first = multicast.failure {
                failure = first
            } else {
                if case .refused(.unauthorized)? = multicast.failure { noteRefusedKey() }
                // Tokens of a request that got no answer are retried alone: the others were sent.
                outcome = multicast.results + multicast.unsent.map { ($0, LegacyHTTPResponse.Result(error: "HTTP_UNAVAILABLE")) }
            }
        } else if let target = message.to, let members = Self.groupMembersToRetry(earlier, target: target) {
            // A device group reached some of its members: only the others get it again.
            request.target = .registrationIDs(members)
            let multicast = await client.sendMulticast(request, to: members, retrying: false)
            if multicast.results.isEmpty, let first = multicast.failure {
                failure = first
            } else {
                outcome = multicast.results + multicast.unsent.map { ($0, LegacyHTTPResponse.Result(error: "HTTP_UNAVAILABLE")) }
            }
        } else {
            let target = message.to ?? message.condition ?? ""
            request.target = message.to.map { .to($0) } ?? .condition(target)
            do {
                switch try await client.send(request, retrying: false) {
                case .tokens(_, _, _, _, let list): outcome = Array(zip([target], list))
                case .topic(let id, let error): outcome = [(target, .init(messageID: id.map(String.init), error: error))]
                case .plainText(let result): outcome = [(target, result)]
                case .group(let success, let failureCount, let failed):
                    // The group's own entry says how many got it; each member FCM could not
                    // reach is retried alone (FCM asks app servers to retry those with backoff).
                    let summary = success > 0 ? LegacyHTTPResponse.Result(messageID: "group:\(success)/\(success + failureCount)")
                                              : LegacyHTTPResponse.Result(error: "GroupSendFailed")
                    outcome = [(target, summary)]
                    if success > 0 { outcome += failed.map { ($0, LegacyHTTPResponse.Result(error: "GroupMemberFailed")) } }
                }
            } catch {
                failure = error
            }
        }
        if let failure {
            settleFailure(failure, row: row, message: message)
            return
        }
        var generator = SystemRandomGenerator()
        let settlement = OutboxSettlement.http(outcome, earlier: earlier, rowID: row.id, attempt: row.attempts + 1,
                                               age: .seconds(now.timeIntervalSince(row.createdAt)), timeToLive: message.timeToLive,
                                               policy: settings.retry, now: Date(), using: &generator)
        if let slowDown = settlement.slowDown {
            let until = ContinuousClock.now + slowDown.duration
            state.withLock { state in
                for target in slowDown.targets { state.slowDowns.slowDown(target, until: until) }
            }
        }
        if let update = settlement.update { record([update], tokens: settlement.tokens) }
    }

    /// A request that got no usable answer: the row is failed (400, invalid), held back
    /// (401, cancelled), or retried with backoff (5xx, transport), never sooner than FCM's
    /// `Retry-After`.
    private func settleFailure(_ failure: FCMHTTPClient.Failure, row: OutboxStore.ClaimedRow, message: DownstreamMessage) {
        let now = Date()
        func retry(code: String, notBefore: Duration?) -> OutboxUpdate {
            var generator = SystemRandomGenerator()
            switch settings.retry.decide(attempt: row.attempts + 1, age: .seconds(now.timeIntervalSince(row.createdAt)),
                                         timeToLive: message.timeToLive, using: &generator) {
            case .retry(let delay):
                let wait = max(delay, min(notBefore ?? .zero, Self.maximumRetryAfter))
                return OutboxUpdate(rowID: row.id, status: .retry, attempts: row.attempts + 1, sentOn: "http", sentAt: now,
                                    errorCode: code, errorDescription: "\(failure)", availableAt: now.addingTimeInterval(wait.seconds))
            case .giveUp:
                return OutboxUpdate(rowID: row.id, status: .expired, attempts: row.attempts + 1, errorCode: code,
                                    errorDescription: "\(failure)")
            }
        }
        switch failure {
        case .invalid(let reason):
            record([OutboxUpdate(rowID: row.id, status: .failed, errorCode: "INVALID_MESSAGE", errorDescription: "\(reason)")])
        case .refused(.unauthorized):
            noteRefusedKey()
            record([OutboxUpdate(rowID: row.id, status: row.attempts > 0 ? .retry : .pending, errorCode: "HTTP_401",
                                           errorDescription: "FCM refused the server key", availableAt: now)])
        case .refused(.badRequest(let reason)):
            record([OutboxUpdate(rowID: row.id, status: .failed, attempts: row.attempts + 1, sentOn: "http", sentAt: now,
                                           errorCode: "HTTP_400", errorDescription: reason)])
        case .refused(.unavailable(_, let retryAfter)):
            warn(failure, kind: "unavailable")
            record([retry(code: "HTTP_UNAVAILABLE", notBefore: retryAfter)])
        case .refused(.unexpected), .transport:
            if case .transport(.cancelled) = failure {
                // Shutdown: whether FCM took it is unknown; the next worker sends it again.
                record([OutboxSettlement.handBack(rowID: row.id, sentBefore: true, now: now)])
                return
            }
            warn(failure, kind: Self.kind(of: failure))
            record([retry(code: "HTTP_UNAVAILABLE", notBefore: nil)])
        }
    }

    /// Logs a failed request: an error for what only the configuration can fix (a refused
    /// certificate, a host that does not resolve), a warning otherwise; once a minute per kind.
    private func warn(_ failure: FCMHTTPClient.Failure, kind: String) {
        guard let leftOut = failureWarnings.admit(kind) else { return }
        let since = leftOut > 0 ? " (\(leftOut) more since the last line)" : ""
        let text = "HTTP requests to FCM fail: \(failure)\(since); rows with transport http are retried with backoff"
        switch failure {
        case .transport(.certificateRejected), .transport(.resolutionFailed):
            logger.error(text + ": check --http-endpoint and --ca-file")
        default:
            logger.warning(text)
        }
    }

    /// A name for the kind of a failed request, for `warn`.
    private static func kind(of failure: FCMHTTPClient.Failure) -> String {
        switch failure {
        case .transport(.certificateRejected): "certificate"
        case .transport(.resolutionFailed): "resolution"
        case .transport(.connectFailed): "connect"
        case .transport: "transport"
        case .refused: "refused"
        case .invalid: "invalid"
        }
    }

    /// A 401: HTTP sending stops until the worker restarts (said once).
    private func noteRefusedKey() {
        let first = state.withLock { state -> Bool in
            defer { state.refused = true }
            return !state.refused
        }
        if first {
            logger.error("FCM refused the server key over HTTP (401): HTTP sending stops until the worker restarts; "
                         + "rows with transport http wait")
        }
    }

    private static func tokenResults(_ text: String?) -> [String: JSONValue] {
        guard let text, case .object(let members)? = try? JSONValue.parse(text) else { return [:] }
        return members
    }

    /// The members of a device group still to be sent to: those a previous attempt could
    /// not reach while it reached others (nil when there are none).
    private static func groupMembersToRetry(_ earlier: [String: JSONValue], target: String) -> [String]? {
        guard earlier[target]?["message_id"] != nil else { return nil }
        let members = earlier.filter { $0.key != target && !isFinal($0.value) }.keys.sorted()
        return members.isEmpty ? nil : members
    }

    /// A token's outcome is final unless it is marked for retry.
    private static func isFinal(_ result: JSONValue) -> Bool {
        result["retry"] != .bool(true)
    }
}
