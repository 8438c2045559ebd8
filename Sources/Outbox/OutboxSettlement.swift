import FCM
import Foundation

/// What FCM's answer to a downstream message means for its outbox row, decided without
/// side effects for both transports: the row's update, the tokens to mark in
/// `device_tokens`, and a target to slow down.
package struct OutboxSettlement: Sendable, Equatable {
    /// The row's new state; nil when the message goes out again at once (XMPP's
    /// `CONNECTION_DRAINING` nack: resend it on another connection).
    package var update: OutboxUpdate?
    package var tokens: [TokenMark] = []
    /// Targets that hit a rate limit, and how long they are held back.
    package var slowDown: SlowDown?

    package struct SlowDown: Sendable, Equatable {
        package var targets: [String]
        package var duration: Duration
    }

    package var resendElsewhere: Bool { update == nil }

    /// Gives a claimed row back unsent or unanswered (shutdown): claimable at once by any
    /// worker, as a retry when it was sent before.
    package static func handBack(rowID: Int64, sentBefore: Bool, now: Date) -> OutboxUpdate {
        OutboxUpdate(rowID: rowID, status: sentBefore ? .retry : .pending, availableAt: now)
    }

    /// The settlement of an XMPP answer (`verdict`) to `message` (whose target is a token
    /// when `targetIsToken`), at `now`.
    package static func xmpp(_ verdict: DownstreamVerdict, rowID: Int64, target: String, targetIsToken: Bool, now: Date) -> OutboxSettlement {
        switch verdict {
        case .acked(let canonical):
            var settlement = OutboxSettlement(update: OutboxUpdate(rowID: rowID, status: .acked, ackedAt: now, canonicalToken: canonical))
            if let canonical, canonical != target, targetIsToken {
                settlement.tokens = [TokenMark(token: target, state: .replaced, canonicalToken: canonical, errorCode: nil)]
            }
            return settlement
        case .failed(let code, let description, let tokenState):
            var settlement = OutboxSettlement(update: OutboxUpdate(rowID: rowID, status: .failed, errorCode: code, errorDescription: description))
            if let tokenState, targetIsToken {
                settlement.tokens = [TokenMark(token: target, state: tokenState == .invalid ? .invalid : .unregistered,
                                               canonicalToken: nil, errorCode: code)]
            }
            return settlement
        case .retry(let delay, let code, let description):
            return OutboxSettlement(update: OutboxUpdate(rowID: rowID, status: .retry, errorCode: code, errorDescription: description,
                                                         availableAt: now.addingTimeInterval(delay.seconds)))
        case .slowDown(let delay, _, let code, let description):
            return OutboxSettlement(update: OutboxUpdate(rowID: rowID, status: .retry, errorCode: code, errorDescription: description,
                                                         availableAt: now.addingTimeInterval(delay.seconds)),
                                    slowDown: SlowDown(targets: [target], duration: delay))
        case .expired(let code, let description):
            return OutboxSettlement(update: OutboxUpdate(rowID: rowID, status: .expired, errorCode: code, errorDescription: description))
        case .resendElsewhere:
            return OutboxSettlement(update: nil)
        }
    }

    /// The settlement of one HTTP attempt at a row: `outcome` holds this attempt's result
    /// per token (or per topic/condition), `earlier` the row's `token_results` so far. The
    /// row is acked once every token has a final outcome and one succeeded, failed when
    /// none did, and retried (only the tokens marked `retry`) while some got
    /// `Unavailable`, `InternalServerError` or a rate limit.
    package static func http(_ outcome: [(token: String, result: LegacyHTTPResponse.Result)], earlier: [String: JSONValue],
                     rowID: Int64, attempt: Int, age: Duration, timeToLive: Int?, policy: DownstreamRetryPolicy,
                     now: Date, using generator: inout some RandomNumberGenerator) -> OutboxSettlement {
        var results = earlier
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
        var update = OutboxUpdate(rowID: rowID, status: .failed, attempts: attempt, sentOn: "http", sentAt: now,
                                  errorCode: firstError, tokenResults: resultsJSON)
        var settlement = OutboxSettlement(update: update, tokens: marks)
        if retryable {
            switch policy.decide(attempt: attempt, age: age, timeToLive: timeToLive, using: &generator) {
            case .retry(let delay):
                update.status = .retry
                update.errorDescription = "some tokens are retried"
                update.availableAt = now.addingTimeInterval(delay.seconds)
                if !slowed.isEmpty { settlement.slowDown = SlowDown(targets: slowed, duration: delay) }
            case .giveUp:
                update.status = .expired
                update.errorDescription = "retries ran out"
            }
        } else if succeeded {
            update.status = .acked
            update.ackedAt = now
        } else {
            update.errorDescription = "every token failed"
        }
        settlement.update = update
        return settlement
    }
}
