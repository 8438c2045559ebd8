import FCM
import Foundation
import Runtime

extension OutboxStore.ClaimedRow {
    /// Why a claimed row is settled without being sent.
    struct Refusal: Error, Sendable {
        let status: OutboxUpdate.Status
        let errorCode: String
        let description: String
    }

    /// The message this row describes (to the canonical token if its target was replaced)
    /// and its parsed payload, or why it is not sent: its token was refused before, its
    /// payload is invalid (checked against every rule of FCM with `validating`), or its
    /// time to live or `maximumAge` has passed. `time_to_live: 0` ("now or never") still
    /// gets its first attempt.
    func message(id messageID: String, validating: Bool, maximumAge: Duration,
                 now: Date) -> Result<(DownstreamMessage, payload: JSONValue), Refusal> {
        if registrationIDs == nil, let tokenState, tokenState != .replaced {
            return .failure(Refusal(status: .failed, errorCode: tokenErrorCode ?? tokenState.rawValue,
                                    description: "not sent: FCM reported this token \(tokenState.rawValue) earlier"))
        }
        let message: DownstreamMessage
        let parsed: JSONValue
        do {
            parsed = try JSONValue.parse(payload)
            let to = tokenState == .replaced ? (canonicalToken ?? target) : target
            message = try DownstreamMessage(target: to, condition: condition, payload: parsed, messageID: messageID)
            if validating { try message.validate() }
        } catch {
            return .failure(Refusal(status: .failed, errorCode: "INVALID_MESSAGE", description: "\(error)"))
        }
        let age = now.timeIntervalSince(createdAt)
        let timeToLive = message.timeToLive ?? DownstreamMessage.maximumTimeToLive
        let firstTryOfNowOrNever = timeToLive == 0 && attempts == 0
        if (age > Double(timeToLive) && !firstTryOfNowOrNever) || age > maximumAge.seconds {
            return .failure(Refusal(status: .expired, errorCode: "EXPIRED",
                                    description: "its time to live (\(timeToLive) s) passed before it could be sent"))
        }
        return .success((message, parsed))
    }
}
