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

    /// What the sender does.
    public enum Action: Sendable, Equatable {
        /// Fail the message; retrying cannot help.
        case fail
        /// Fail it and mark its token (unregistered, of another sender, malformed).
        case failAndMarkToken(NackAction.TokenState)
        /// Retry with backoff, no sooner than `Retry-After`.
        case retry
        /// The project's quota ran out: every send slows down, no sooner than `Retry-After`.
        case slowDownProject
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

    public init(httpStatus: Int, status: String, errorCode: String?, message: String, fieldViolations: [FieldViolation] = [],
                retryAfter: Duration?) {
        self.httpStatus = httpStatus
        self.status = status
        self.errorCode = errorCode
        self.message = message
        self.fieldViolations = fieldViolations
        self.retryAfter = retryAfter
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

    public var action: Action {
        switch errorCode {
        case "UNREGISTERED": return .failAndMarkToken(.unregistered)
        case "SENDER_ID_MISMATCH": return .failAndMarkToken(.unregistered)
        case "QUOTA_EXCEEDED": return .slowDownProject
        case "UNAVAILABLE", "INTERNAL": return .retry
        case "THIRD_PARTY_AUTH_ERROR": return .fail
        case "INVALID_ARGUMENT":
            return refusesTheToken ? .failAndMarkToken(.invalid) : .fail
        default:
            break
        }
        switch (httpStatus, status) {
        case (_, "UNAUTHENTICATED"), (401, _): return .refreshToken
        case (_, "PERMISSION_DENIED"), (403, _): return .stopSending
        case (404, _): return .stopSending
        case (429, _), (_, "RESOURCE_EXHAUSTED"): return .slowDownProject
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
