/// What the worker does about a nack, by error code (docs/protocol.md section 4).
public enum NackAction: Sendable, Equatable {
    /// How a token was found bad.
    public enum TokenState: String, Sendable, Equatable {
        /// `BAD_REGISTRATION`: malformed.
        case invalid
        /// `DEVICE_UNREGISTERED`: the app was uninstalled or the token expired.
        case unregistered
    }

    /// What a rate limit applies to.
    public enum RateScope: String, Sendable, Equatable {
        case device, topic
    }

    /// Mark the message failed; retrying cannot help.
    case fail
    /// Mark the message failed and the target token bad: later messages to it fail fast.
    case failAndMarkToken(TokenState)
    /// Retry with exponential backoff and jitter (FCM was unavailable or failed).
    case retryWithBackoff
    /// Slow down for that device or topic: retry later, never at once.
    case slowDown(RateScope)
    /// Send it again on another connection (this one is draining).
    case resendOnAnotherConnection
    /// Our ack was malformed: a bug on our side, logged loudly; the message is retried.
    case reportOurBug

    /// The action for `code`. Unknown codes are retried with backoff (bounded by the
    /// retry policy's maximum age), so that a code FCM adds later never loses a message.
    public init(code: String) {
        switch code {
        case "INVALID_JSON", "SENDER_ID_MISMATCH", "INVALID_APNS_CREDENTIAL", "AUTHENTICATION_FAILED": self = .fail
        case "BAD_REGISTRATION": self = .failAndMarkToken(.invalid)
        case "DEVICE_UNREGISTERED": self = .failAndMarkToken(.unregistered)
        case "SERVICE_UNAVAILABLE", "INTERNAL_SERVER_ERROR": self = .retryWithBackoff
        case "DEVICE_MESSAGE_RATE_EXCEEDED": self = .slowDown(.device)
        case "TOPICS_MESSAGE_RATE_EXCEEDED": self = .slowDown(.topic)
        case "CONNECTION_DRAINING": self = .resendOnAnotherConnection
        case "BAD_ACK": self = .reportOurBug
        default: self = .retryWithBackoff
        }
    }
}
