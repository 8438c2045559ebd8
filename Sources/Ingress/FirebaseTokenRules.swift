import Foundation

/// What a Firebase token must say to be accepted, as firebase-admin checks it
/// (`auth.verify_id_token`, `app_check.verify_token`): the kind of token, the project and
/// the clock skew tolerated.
public struct FirebaseTokenRules: Sendable {
    public enum Kind: String, Sendable {
        /// A Firebase Auth ID token (`Authorization: Bearer`): `sub` is the user's uid.
        case idToken = "id-token"
        /// A Firebase App Check token (`X-Firebase-AppCheck`): `sub` is the app's id.
        case appCheck = "app-check"
    }

    public var kind: Kind
    /// The Firebase project's id (`aud` of an ID token; `projects/<id>` in App Check's).
    public var projectID: String
    /// The project's number: when given, an App Check token's `iss` must name it (else only
    /// its issuer prefix is checked, as firebase-admin does). Its `aud` must list
    /// `projects/<project id>` whether or not the number is given, as firebase-admin asks.
    public var projectNumber: String?
    /// How far an ID token's `exp`, `iat`, `auth_time` and `nbf` may be off (firebase-admin's
    /// `clock_skew_seconds`, 0–60 s). App Check tokens get none, as `app_check.verify_token`
    /// allows none (`toleratedSkew`).
    public var clockSkew: Duration

    /// The skew the checks allow this kind of token: `clockSkew` for ID tokens, zero for App Check.
    public var toleratedSkew: Duration { kind == .appCheck ? .zero : clockSkew }

    public init(kind: Kind, projectID: String, projectNumber: String? = nil, clockSkew: Duration = .seconds(10)) {
        self.kind = kind
        self.projectID = projectID
        self.projectNumber = projectNumber
        self.clockSkew = clockSkew
    }

    /// The ID tokens' issuer.
    public var idTokenIssuer: String { "https://securetoken.google.com/" + projectID }
    /// App Check's issuer prefix.
    public static let appCheckIssuerPrefix = "https://firebaseappcheck.googleapis.com/"
}
