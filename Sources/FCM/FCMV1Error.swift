import Foundation

/// An error answer of FCM's v1 API: its HTTP status, canonical status, FCM's own error code,
/// message and field violations, `Retry-After`, and what a sender does about it (`action`).
public struct FCMV1Error: Error, Sendable, Equatable, CustomStringConvertible {
    public struct FieldViolation: Sendable, Equatable {
        public let field: String
        public let description: String
        public init(field: String, description: String) {
            self.field = field
            self.description = description
        }
    }

    /// Which rate a `QUOTA_EXCEEDED` (or a 429 `RESOURCE_EXHAUSTED`) says was exceeded.
    public enum QuotaScope: String, Sendable, Equatable {
        /// The project's message rate (FCM's default: 600,000 a minute).
        case project
        /// One device's message rate.
        case device
        /// One topic's fan-out rate.
        case topic
    }

    /// What the sender does.
    public enum Action: Sendable, Equatable {
        /// Fail the message; retrying cannot help.
        case fail
        /// Fail it and mark its token (unregistered, malformed): Google's only two reasons to
        /// drop a token.
        case failAndMarkToken(NackAction.TokenState)
        /// `SENDER_ID_MISMATCH`: fail the message and keep its token (it belongs to another
        /// project than the one the credentials send for). Many of them across distinct
        /// tokens mean the credentials are wrong: the sender watches for that.
        case failForSenderMismatch
        /// Retry with backoff, no sooner than `Retry-After`.
        case retry
        /// The project's quota ran out (or the answer does not say whose): every send
        /// pauses, an exponential backoff from a minute up (`Retry-After` when longer), then
        /// resumes paced.
        case slowDownProject
        /// One device's or one topic's rate was exceeded: only that target's messages wait
        /// (a topic from a minute up, as the project).
        case slowDownTarget
        /// The access token was refused: fetch a new one and send again once.
        case refreshToken
        /// The credentials cannot send for this project (a 403 without an FCM code, an
        /// unknown project): a configuration error; sending stops, rows wait.
        case stopSending
    }

    public let httpStatus: Int
    /// The canonical status (`INVALID_ARGUMENT`, `NOT_FOUND`, `UNAUTHENTICATED`…).
    public let status: String
    /// FCM's own code from `details` (`UNREGISTERED`, `QUOTA_EXCEEDED`…), when given.
    public let errorCode: String?
    public let message: String
    public var fieldViolations: [FieldViolation] = []
    public let retryAfter: Duration?
    /// For a quota refusal: the rate exceeded, from `google.rpc.QuotaFailure` (or the
    /// message); nil when the answer does not say (read as the project's).
    public var quotaScope: QuotaScope?

    public init(httpStatus: Int, status: String, errorCode: String?, message: String, fieldViolations: [FieldViolation] = [],
                retryAfter: Duration?, quotaScope: QuotaScope? = nil) {
        self.httpStatus = httpStatus
        self.status = status
        self.errorCode = errorCode
        self.message = message
        self.fieldViolations = fieldViolations
        self.retryAfter = retryAfter
        self.quotaScope = quotaScope
    }

    /// True for a refusal of the project's or a target's send rate (`QUOTA_EXCEEDED`, or a
    /// 429 / `RESOURCE_EXHAUSTED` without an FCM code).
    public var isQuota: Bool {
        errorCode == "QUOTA_EXCEEDED" || (errorCode == nil && (httpStatus == 429 || status == "RESOURCE_EXHAUSTED"))
    }

    /// What a row records: FCM's code, else the canonical status.
    public var code: String { errorCode ?? status }

    public var description: String {
        var text = "\(code) (HTTP \(httpStatus)): \(message)"
        if !fieldViolations.isEmpty {
            text += " [" + fieldViolations.map { "\($0.field): \($0.description)" }.joined(separator: "; ") + "]"
        }
        return text
    }

    /// What FCM's `ErrorCode` table (docs/protocol.md's v1 section) says to do: only
    /// `UNREGISTERED` and a token-format `INVALID_ARGUMENT` drop a token; `APNS_AUTH_ERROR`
    /// is `THIRD_PARTY_AUTH_ERROR` by its older name (fail, never an access-token refresh);
    /// a quota refusal slows down what its `QuotaFailure` names. Only a 401 without an FCM
    /// code is the access token's.
    public var action: Action {
        if isQuota { return quotaScope == .device || quotaScope == .topic ? .slowDownTarget : .slowDownProject }
        switch errorCode {
        case "UNREGISTERED": return .failAndMarkToken(.unregistered)
        case "SENDER_ID_MISMATCH": return .failForSenderMismatch
        case "UNAVAILABLE", "INTERNAL": return .retry
        case "THIRD_PARTY_AUTH_ERROR", "APNS_AUTH_ERROR": return .fail
        case "INVALID_ARGUMENT":
            return refusesTheToken ? .failAndMarkToken(.invalid) : .fail
        case .some:
            // Another FCM code (UNSPECIFIED_ERROR, a newer one): about the message, not
            // the access token, whatever the HTTP status.
            if httpStatus == 401 || status == "UNAUTHENTICATED" { return .fail }
        case nil:
            break
        }
        switch (httpStatus, status) {
        case (_, "UNAUTHENTICATED"), (401, _): return .refreshToken
        case (_, "PERMISSION_DENIED"), (403, _): return .stopSending
        case (404, _): return .stopSending
        case (400, _), (_, "INVALID_ARGUMENT"): return refusesTheToken ? .failAndMarkToken(.invalid) : .fail
        case (500..., _), (_, "UNAVAILABLE"), (_, "INTERNAL"): return .retry
        default: return httpStatus >= 400 && httpStatus < 500 ? .fail : .retry
        }
    }

    /// An `INVALID_ARGUMENT` about the registration token itself (FCM: "The registration
    /// token is not a valid FCM registration token"): the token is dropped.
    private var refusesTheToken: Bool {
        fieldViolations.contains { $0.field == "message.token" } || message.localizedCaseInsensitiveContains("registration token is not a valid")
    }

    /// The canonical status of an HTTP status, for an error body without one.
    static func canonicalStatus(forHTTP status: Int) -> String {
        switch status {
        case 400: "INVALID_ARGUMENT"
        case 401: "UNAUTHENTICATED"
        case 403: "PERMISSION_DENIED"
        case 404: "NOT_FOUND"
        case 429: "RESOURCE_EXHAUSTED"
        case 500: "INTERNAL"
        case 503: "UNAVAILABLE"
        default: "HTTP_\(status)"
        }
    }
}
