/// What becomes of a sent downstream message once FCM has answered it (docs/protocol.md
/// section 4), decided without side effects so that every code's path is testable.
public enum DownstreamVerdict: Sendable, Equatable {
    /// FCM took it; `canonicalToken` replaces the target token from now on when set.
    case acked(canonicalToken: String?)
    /// Final: retrying cannot help. `token` says how to mark the target token, if at all.
    case failed(code: String, description: String?, token: NackAction.TokenState?)
    /// Send it again after `delay` (FCM unavailable or failed, or an unknown code).
    case retry(after: Duration, code: String, description: String?)
    /// The target hit a rate limit: hold it and its other messages back for `delay`.
    case slowDown(after: Duration, scope: NackAction.RateScope, code: String, description: String?)
    /// Its time to live or the maximum age would pass before another attempt.
    case expired(code: String, description: String?)
    /// Send it again at once on another connection (this one is draining).
    case resendElsewhere

    /// The verdict on a nack with `code` for attempt `attempt` of a message `age` old.
    public static func nack<G: RandomNumberGenerator>(code: String, description: String?, attempt: Int, age: Duration,
                                                      timeToLive: Int?, policy: DownstreamRetryPolicy,
                                                      using generator: inout G) -> DownstreamVerdict {
        func later(_ make: (Duration) -> DownstreamVerdict) -> DownstreamVerdict {
            switch policy.decide(attempt: attempt, age: age, timeToLive: timeToLive, using: &generator) {
            case .retry(let delay): make(delay)
            case .giveUp: .expired(code: code, description: description)
            }
        }
        switch NackAction(code: code) {
        case .fail: return .failed(code: code, description: description, token: nil)
        case .failAndMarkToken(let state): return .failed(code: code, description: description, token: state)
        case .retryWithBackoff, .reportOurBug:
            return later { .retry(after: $0, code: code, description: description) }
        case .slowDown(let scope):
            return later { .slowDown(after: $0, scope: scope, code: code, description: description) }
        case .resendOnAnotherConnection: return .resendElsewhere
        }
    }

    /// The verdict on a stanza error (`<message type="error">`) with an RFC 6120 condition.
    /// Conditions that say the server could not cope now are retried like
    /// `SERVICE_UNAVAILABLE`; the rest (`bad-request`: the stanza or its JSON was refused)
    /// are final.
    public static func stanzaError<G: RandomNumberGenerator>(condition: String, text: String?, attempt: Int, age: Duration,
                                                             timeToLive: Int?, policy: DownstreamRetryPolicy,
                                                             using generator: inout G) -> DownstreamVerdict {
        let code = "STANZA_ERROR:\(condition)"
        switch condition {
        case "internal-server-error", "service-unavailable", "remote-server-timeout", "resource-constraint":
            switch policy.decide(attempt: attempt, age: age, timeToLive: timeToLive, using: &generator) {
            case .retry(let delay): return .retry(after: delay, code: code, description: text)
            case .giveUp: return .expired(code: code, description: text)
            }
        default:
            return .failed(code: code, description: text, token: nil)
        }
    }
}
