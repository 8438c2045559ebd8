/// Why a Firebase token was refused: a reason code (for the answer's body, the logs and
/// `fcm_worker_ingress_auth_failures_total{reason}`) and what exactly was wrong. Never
/// holds the token.
public struct TokenRefusal: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Reason: String, Sendable, CaseIterable {
        /// No token where one is required.
        case missing
        /// Not a JWT, or not JSON inside.
        case malformed
        /// `alg` is not RS256 (`none`, HS256, …), or the header lacks what it needs.
        case unsupportedAlgorithm = "unsupported_algorithm"
        /// No published key has the token's `kid`.
        case unknownKey = "unknown_key"
        /// The signature does not verify.
        case badSignature = "bad_signature"
        /// `exp` has passed.
        case expired
        /// `iat`, `auth_time` or `nbf` lies in the future.
        case notYetValid = "not_yet_valid"
        /// Issued for another project (`aud`).
        case wrongAudience = "wrong_audience"
        /// Not issued by Firebase for this project (`iss`).
        case wrongIssuer = "wrong_issuer"
        /// `sub` is missing, empty or too long.
        case badSubject = "bad_subject"
        /// No key set could be fetched yet.
        case keysUnavailable = "keys_unavailable"
    }

    public let reason: Reason
    public let detail: String

    public init(_ reason: Reason, _ detail: String) {
        self.reason = reason
        self.detail = detail
    }

    public var description: String { "\(reason.rawValue): \(detail)" }
}
