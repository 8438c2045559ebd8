import FCM
import Foundation
import Postgres
import XMPP
import Runtime

/// Sends the outbox rows whose transport is `http` through FCM's legacy HTTP protocol:
/// rows with `registration_ids` as multicasts (1,000 tokens per request), the others to
/// their `target` or `condition`. Claims use the same lease as the XMPP sender, so a row
/// is never sent by both transports (each claims only its own).
///
/// Each token's outcome is written to the row's `token_results`; tokens FCM reports bad
/// or replaced are marked in `device_tokens`, as for XMPP nacks. A row is `acked` once
/// every token has a final outcome and one succeeded, `failed` when none did, and `retry`
/// while some token got `Unavailable`, `InternalServerError` or a rate limit (only those
/// tokens are sent again). A 401 stops HTTP sending until the worker restarts: it is a
/// configuration error, never retried in a loop.
final class HTTPOutboxSender: Sendable {
    private let store: OutboxStore
    private let client: FCMHTTPClient
    private let settings: DownstreamSettings
    private let logger: Logger
    let doorbell = Doorbell()
    private let running = BlockingLock((claiming: true, refused: false))
    /// Devices and topics that hit a rate limit, and until when their rows wait.
    private let slowedUntil = BlockingLock<[String: Date]>([:])
    /// Rows processed at once (each may be a multicast of several requests).
    private let batch = 8

    init(pool: PostgresPool, client: FCMHTTPClient, settings: DownstreamSettings, logger: Logger) {
        var store = OutboxStore(pool: pool, workerID: settings.workerID, lease: settings.lease)
        store.transport = "http"
        self.store = store
        self.client = client
        self.settings = settings
        self.logger = logger
    }

    /// Claims and sends until `finish()`.
    func run() async {
        var delay = Duration.milliseconds(100)
        while running.withLock({ $0.claiming && !$0.refused }) {
            let rows: [OutboxStore.ClaimedRow]
            do {
                rows = try await store.claim(limit: batch)
                delay = .milliseconds(100)
            } catch {
                logger.warning("could not claim outbox rows for HTTP (retrying in \(delay.formattedSeconds)): \(error)")
                await doorbell.wait(timeout: delay)
                delay = min(delay * 2, .seconds(10))
                continue
            }
            if rows.isEmpty {
                await doorbell.wait(timeout: settings.sweepInterval)
                continue
            }
            await withTaskGroup(of: Void.self) { group in
                for row in rows { group.addTask { await self.send(row) } }
            }
        }
    }

    /// Stops claiming; rows being sent finish their request.
    func finish() {
        running.withLock { $0.claiming = false }
        doorbell.ring()
    }

    private func send(_ row: OutboxStore.ClaimedRow) async {
        let now = Date()
        let message: DownstreamMessage
        switch row.message(id: "http", validating: false, maximumAge: settings.retry.maximumAge, now: now) {
        case .success(let prepared):
            message = prepared.0
        case .failure(let refusal):
            await write(row, status: refusal.status.rawValue, errorCode: refusal.errorCode, description: refusal.description)
            return
        }
        if let target = message.to ?? message.condition,
           let until = slowedUntil.withLock({ $0[target] }), until > now {
            // Held back like XMPP's rate-limit slowdown: not sent, not counted as an attempt.
            await write(row, status: row.attempts > 0 ? "retry" : "pending", errorCode: nil, description: nil,
                        availableAt: until, countsAsAttempt: false)
            return
        }
        var request = LegacyHTTPMessage(target: .to(""))
        request.options = message
        var results = Self.tokenResults(row.tokenResults)
        let tokens: [String]
        if let registrationIDs = row.registrationIDs {
            guard !registrationIDs.isEmpty else {
                await write(row, status: "failed", errorCode: "INVALID_MESSAGE", description: "invalid downstream message: registration_ids is empty")
                return
            }
            tokens = registrationIDs.filter { results[$0].map { !Self.isFinal($0) } ?? true }
            request.target = .registrationIDs(tokens)
        } else if let to = message.to {
            tokens = to.hasPrefix("/topics/") ? [] : [to]
            request.target = .to(to)
        } else {
            tokens = []
            request.target = .condition(message.condition ?? "")
        }

        let outcome: [(String, LegacyHTTPResponse.Result)]
        do {
            if case .registrationIDs = request.target {
                outcome = Array(zip(tokens, try await client.sendMulticast(request, to: tokens)))
            } else {
                switch try await client.send(request) {
                case .tokens(_, _, _, _, let list): outcome = Array(zip(tokens, list))
                case .topic(let id, let error): outcome = [(message.to ?? message.condition ?? "", .init(messageID: id.map(String.init), error: error))]
                case .plainText(let result): outcome = Array(zip(tokens, [result]))
                }
            }
        } catch {
            await handle(error, row: row, message: message)
            return
        }

        var marks: [TokenMark] = []
        var slowed: [String] = []
        var retryable = false, succeeded = false, firstError: String?
        for (token, result) in outcome {
            var entry: [String: JSONValue] = [:]
            if let id = result.messageID { entry["message_id"] = .string(id); succeeded = true }
            if let canonical = result.canonicalRegistrationID {
                entry["registration_id"] = .string(canonical)
                if canonical != token { marks.append(TokenMark(token: token, state: .replaced, canonicalToken: canonical, errorCode: nil)) }
            }
            if let error = result.error {
                entry["error"] = .string(error)
                firstError = firstError ?? error
                switch NackAction(httpError: error) {
                case .failAndMarkToken(let state):
                    marks.append(TokenMark(token: token, state: state == .invalid ? .invalid : .unregistered, canonicalToken: nil, errorCode: error))
                case .slowDown:
                    slowed.append(token)
                    entry["retry"] = .bool(true)
                    retryable = true
                case .retryWithBackoff, .resendOnAnotherConnection, .reportOurBug:
                    entry["retry"] = .bool(true)
                    retryable = true
                case .fail:
                    break
                }
            }
            results[token] = .object(entry)
        }
        let resultsJSON = JSONValue.object(results).serialized
        // The row's status follows every token's outcome so far, not only this attempt's.
        succeeded = succeeded || results.values.contains { $0["message_id"] != nil }
        if firstError == nil { firstError = results.values.lazy.compactMap { $0["error"]?.stringValue }.first }
        if retryable {
            var generator = SystemRandomNumberGenerator()
            switch settings.retry.decide(attempt: row.attempts + 1, age: .seconds(now.timeIntervalSince(row.createdAt)), timeToLive: message.timeToLive, using: &generator) {
            case .retry(let delay):
                let until = Date().addingTimeInterval(delay.seconds)
                slowedUntil.withLock { held in
                    held = held.filter { $0.value > now }
                    for target in slowed { held[target] = max(held[target] ?? until, until) }
                }
                await write(row, status: "retry", errorCode: firstError, description: "some tokens are retried", results: resultsJSON,
                            marks: marks, availableAt: until)
            case .giveUp:
                await write(row, status: "expired", errorCode: firstError, description: "retries ran out", results: resultsJSON, marks: marks)
            }
        } else if succeeded {
            await write(row, status: "acked", errorCode: firstError, description: nil, results: resultsJSON, marks: marks)
        } else {
            await write(row, status: "failed", errorCode: firstError, description: "every token failed", results: resultsJSON, marks: marks)
        }
    }

    private func handle(_ error: FCMHTTPClient.Failure, row: OutboxStore.ClaimedRow, message: DownstreamMessage) async {
        switch error {
        case .invalid(let reason):
            await write(row, status: "failed", errorCode: "INVALID_MESSAGE", description: "\(reason)")
        case .refused(.unauthorized):
            let first = running.withLock { state -> Bool in
                defer { state.refused = true }
                return !state.refused
            }
            if first {
                logger.error("FCM refused the server key over HTTP (401): HTTP sending stops until the worker restarts; "
                             + "rows with transport http wait")
            }
            await write(row, status: row.attempts > 0 ? "retry" : "pending", errorCode: "HTTP_401",
                        description: "FCM refused the server key", availableAt: Date(), countsAsAttempt: false)
        case .refused(.badRequest(let reason)):
            await write(row, status: "failed", errorCode: "HTTP_400", description: reason)
        case .refused, .transport:
            var generator = SystemRandomNumberGenerator()
            let age = Duration.seconds(Date().timeIntervalSince(row.createdAt))
            switch settings.retry.decide(attempt: row.attempts + 1, age: age, timeToLive: message.timeToLive, using: &generator) {
            case .retry(let delay):
                await write(row, status: "retry", errorCode: "HTTP_UNAVAILABLE", description: "\(error)",
                            availableAt: Date().addingTimeInterval(delay.seconds))
            case .giveUp:
                await write(row, status: "expired", errorCode: "HTTP_UNAVAILABLE", description: "\(error)")
            }
        }
    }

    /// Writes a row's outcome (where this worker still holds it) and the token marks,
    /// retrying while the database is unreachable.
    private func write(_ row: OutboxStore.ClaimedRow, status: String, errorCode: String?, description: String?,
                       results: String? = nil, marks: [TokenMark] = [], availableAt: Date? = nil, countsAsAttempt: Bool = true) async {
        let now = Date()
        let statement = PostgresStatement("""
            UPDATE downstream_messages SET status = $3, attempts = attempts + $4, sent_on = 'http',
                sent_at = CASE WHEN $4 = 1 THEN to_timestamp($5) ELSE sent_at END,
                acked_at = CASE WHEN $3 = 'acked' THEN to_timestamp($5) ELSE acked_at END,
                error_code = coalesce($6, error_code), error_description = coalesce($7, error_description),
                token_results = coalesce($8::jsonb, token_results), available_at = to_timestamp($9)
            WHERE id = $1 AND claimed_by = $2
            """, [.int(row.id), .text(settings.workerID), .text(status), .int(countsAsAttempt ? 1 : 0),
                  .double(now.timeIntervalSince1970), errorCode.map { .text($0) } ?? .null,
                  description.map { .text($0) } ?? .null, results.map { .jsonb($0) } ?? .null,
                  availableAt.map { .double($0.timeIntervalSince1970) } ?? .null])
        var delay = Duration.milliseconds(100)
        while true {
            do {
                try await store.write([], tokens: marks, extra: [statement])
                return
            } catch {
                logger.warning("could not record the HTTP outcome of outbox row \(row.id) (retrying in \(delay.formattedSeconds)): \(error)")
                try? await Task.sleep(for: delay)
                delay = min(delay * 2, .seconds(10))
            }
        }
    }

    private static func tokenResults(_ text: String?) -> [String: JSONValue] {
        guard let text, case .object(let members)? = try? JSONValue.parse(text) else { return [:] }
        return members
    }

    /// A token's outcome is final unless it is marked for retry.
    private static func isFinal(_ result: JSONValue) -> Bool {
        result["retry"] != .bool(true)
    }
}
