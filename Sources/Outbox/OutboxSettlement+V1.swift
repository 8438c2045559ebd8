import FCM
import Foundation

extension OutboxSettlement {
    /// One target's outcome of a v1 attempt.
    package enum V1Outcome: Sendable, Equatable {
        /// FCM took it: the message's name.
        case sent(name: String)
        /// FCM refused it.
        case refused(FCMV1Error)
        /// No answer that says it was not delivered: a transport failure, an outcome that
        /// is unknown, a token endpoint that cannot be reached. Sent again with backoff.
        case unanswered(code: String, description: String)
    }

    /// The settlement of one v1 attempt at a row: `outcome` holds this attempt's result per
    /// target (each token of a fan-out, else the row's one target), `earlier` a fan-out's
    /// `token_results` so far. A row with one target gets FCM's name for the message in
    /// `message_name`, or its error in `error_code` and `error_description`. A fan-out
    /// (`fanOut`: the row's `registration_ids`) gets each token's entry in `token_results`:
    /// `{"name": …}` when FCM took it, `{"error": CODE}` when it refused it, with
    /// `"retry": true` when it is sent again. The row is acked once every target has a final
    /// outcome and one succeeded, failed when none did, and retried (only the targets marked
    /// `retry`) while some got `UNAVAILABLE`, `INTERNAL`, `QUOTA_EXCEEDED` or no answer, no
    /// sooner than the longest `Retry-After` (capped at `maximumRetryAfter`) nor than
    /// `notBefore` (the end of a quota pause that covers it). Tokens FCM reports gone or
    /// malformed are marked; `SENDER_ID_MISMATCH` fails the target and keeps its token.
    package static func v1(_ outcome: [(target: String, isDevice: Bool, outcome: V1Outcome)], fanOut: Bool, notBefore quotaEnd: Date? = nil,
                           earlier: [String: JSONValue],
                           rowID: Int64, attempt: Int, age: Duration, timeToLive: Int?, policy: DownstreamRetryPolicy,
                           maximumRetryAfter: Duration, sentAt: Date, now: Date,
                           using generator: inout some RandomNumberGenerator) -> OutboxSettlement {
        if !fanOut, outcome.count == 1, case .sent(let name) = outcome[0].outcome {
            // The usual answer: one target, delivered.
            return OutboxSettlement(update: OutboxUpdate(rowID: rowID, status: .acked, attempts: attempt, sentOn: "v1", sentAt: sentAt,
                                                         ackedAt: now, messageName: name))
        }
        var results = fanOut ? earlier : [:]
        var marks: [TokenMark] = []
        var retryable = false
        var notBefore: Duration = .zero
        var firstError: (code: String, description: String)?
        for (target, isDevice, result) in outcome {
            var entry: [String: JSONValue] = [:]
            switch result {
            case .sent(let name):
                entry["name"] = .string(name)
            case .refused(let error):
                entry["error"] = .string(error.code)
                firstError = firstError ?? (error.code, error.description)
                switch error.action {
                case .failAndMarkToken(let state):
                    if isDevice {
                        marks.append(TokenMark(token: target, state: state == .invalid ? .invalid : .unregistered,
                                               canonicalToken: nil, errorCode: error.code))
                    }
                case .fail, .stopSending, .failForSenderMismatch:
                    break
                case .retry, .slowDownProject, .slowDownTarget, .refreshToken:
                    entry["retry"] = true
                    retryable = true
                    if let after = error.retryAfter { notBefore = max(notBefore, min(after, maximumRetryAfter)) }
                }
            case .unanswered(let code, let description):
                entry["error"] = .string(code)
                entry["retry"] = true
                retryable = true
                firstError = firstError ?? (code, description)
            }
            results[target] = .object(entry)
        }
        let succeeded = results.values.contains { $0["name"] != nil }
        if firstError == nil, let code = results.values.lazy.compactMap({ $0["error"]?.stringValue }).first {
            firstError = (code, "")
        }
        var update = OutboxUpdate(rowID: rowID, status: .failed, attempts: attempt, sentOn: "v1", sentAt: sentAt,
                                  errorCode: firstError?.code, errorDescription: firstError?.description,
                                  tokenResults: fanOut ? JSONValue.object(results).serialized : nil)
        if retryable {
            switch policy.decide(attempt: attempt, age: age, timeToLive: timeToLive, using: &generator) {
            case .retry(let delay):
                update.status = .retry
                update.availableAt = max(now.addingTimeInterval(max(delay, notBefore).seconds), quotaEnd ?? .distantPast)
            case .giveUp:
                update.status = .expired
                update.errorDescription = "retries ran out: \(firstError?.description ?? "")"
            }
        } else if succeeded {
            update.status = .acked
            update.ackedAt = now
        } else if fanOut && results.count > 1 {
            update.errorDescription = "every target failed: \(firstError?.description ?? "")"
        }
        return OutboxSettlement(update: update, tokens: marks)
    }
}
