import FCM
import Foundation
import Runtime

extension OutboxStore.ClaimedRow {
    /// Why a claimed row is settled without being sent.
    package struct Refusal: Error, Sendable {
        package let status: OutboxUpdate.Status
        package let errorCode: String
        package let description: String
    }

    /// The row with the message it describes (to the canonical token if its target was
    /// replaced) and whether its payload names its own `message_id`, or why it is not sent:
    /// its token was refused before, its payload is invalid (checked against every rule of
    /// FCM with `validating`), its time to live has passed (`EXPIRED`), or it was sent before
    /// and is older than `maximumAge` (`--retry-max-age`, `RETRY_MAX_AGE`). `maximumAge`
    /// limits retries only: a row never sent (a backlog after a long outage) gets its first
    /// attempt while its time to live lasts, and `time_to_live: 0` ("now or never") gets its
    /// first attempt too.
    /// A `ClaimedMessage` rather than a tuple: a tuple inside a `Result` is copied through
    /// value witnesses looked up at run time.
    package func claimedMessage(id messageID: String, validating: Bool, maximumAge: Duration,
                                now: Date) -> Result<ClaimedMessage, Refusal> {
        if let refusal = markedTokenRefusal { return .failure(refusal) }
        let message: DownstreamMessage
        let parsed: JSONValue
        do {
            parsed = try JSONValue.parse(payload)
            message = try DownstreamMessage(target: sendTarget, condition: condition, payload: parsed, messageID: messageID)
            if validating { try message.validate() }
        } catch {
            return .failure(Refusal(status: .failed, errorCode: "INVALID_MESSAGE", description: "\(error)"))
        }
        if let refusal = expiryRefusal(timeToLive: message.timeToLive, maximumAge: maximumAge, now: now) { return .failure(refusal) }
        return .success(ClaimedMessage(row: self, message: message, payloadHasMessageID: parsed["message_id"] != nil))
    }

    /// The target to send to: the canonical token FCM named if this one was replaced.
    package var sendTarget: String? {
        tokenState == .replaced ? (canonicalToken ?? target) : target
    }

    /// Why a row to one token FCM refused before is not sent (nil when it may be).
    package var markedTokenRefusal: Refusal? {
        guard registrationIDs == nil, let tokenState, tokenState != .replaced else { return nil }
        return Refusal(status: .failed, errorCode: tokenErrorCode ?? tokenState.rawValue,
                       description: "not sent: FCM reported this token \(tokenState.rawValue) earlier")
    }

    /// Why a row is too old to be sent (nil when it is not): its time to live (seconds; FCM's
    /// four weeks when nil) passed (`EXPIRED`), or it was sent before and is older than
    /// `maximumAge` (`RETRY_MAX_AGE`).
    /// A negative time to live is no time to live at all: every transport fails the row as
    /// invalid (`INVALID_MESSAGE`), as the validating ones do, rather than some expiring it.
    package func expiryRefusal(timeToLive: Int?, maximumAge: Duration, now: Date) -> Refusal? {
        if let timeToLive, timeToLive < 0 {
            return Refusal(status: .failed, errorCode: "INVALID_MESSAGE",
                           description: "time_to_live: \(timeToLive) is outside 0…\(DownstreamMessage.maximumTimeToLive) seconds")
        }
        let age = now.timeIntervalSince(createdAt)
        let timeToLive = timeToLive ?? DownstreamMessage.maximumTimeToLive
        let firstTryOfNowOrNever = timeToLive == 0 && attempts == 0
        if age > Double(timeToLive) && !firstTryOfNowOrNever {
            return Refusal(status: .expired, errorCode: "EXPIRED", description: "its time to live (\(timeToLive) s) passed before it could be sent")
        }
        if attempts > 0, age > maximumAge.seconds {
            return Refusal(status: .expired, errorCode: "RETRY_MAX_AGE",
                           description: "not sent again after \(attempts) attempt(s): queued \(Int(age)) s ago, "
                               + "over --retry-max-age (\(Int(maximumAge.seconds)) s)")
        }
        return nil
    }
}

extension OutboxStore.ClaimedRow.Refusal {
    /// Logs a row settled without being sent: an invalid one each time (a bug in what
    /// wrote it), expired ones once a minute per reason (a backlog past its time to live is
    /// many rows), with how many more since.
    package func log(rowID: Int64, to logger: Logger, throttle: WarningThrottle) {
        switch errorCode {
        case "INVALID_MESSAGE":
            logger.warning("outbox row \(rowID) is invalid and is not sent: \(description)")
        case "EXPIRED", "RETRY_MAX_AGE":
            guard let leftOut = throttle.admit(errorCode) else { return }
            let since = leftOut > 0 ? " (and \(leftOut) more row(s) since the last line)" : ""
            logger.warning("outbox row \(rowID) expired without being sent: \(description)\(since)")
        default:
            break
        }
    }
}
