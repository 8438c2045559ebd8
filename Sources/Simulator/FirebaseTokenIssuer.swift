internal import COpenSSL
import FCM
import Foundation
import Ingress
import Transport

/// Firebase's token services as the simulator plays them: it mints Firebase Auth ID tokens
/// and App Check tokens signed with keys of its own, and publishes those keys in Google's
/// two forms (X.509 certificates by kid; a JWK set), which the v1 simulator serves at
/// `idTokenKeysPath` and `appCheckKeysPath`. The tokens are what Google's are: RS256, a
/// `kid`, the claims firebase-admin checks (docs/simulator.md).
public final class FirebaseTokenIssuer: Sendable {
    public let projectID: String
    public let projectNumber: String
    public let idTokenKeyID: String
    public let appCheckKeyID: String
    private let idTokenKey: RSAPrivateKey
    private let appCheckKey: RSAPrivateKey
    /// A key no published set holds (tokens signed with it name an unknown kid).
    private let strayKey: RSAPrivateKey
    private let idTokenCertificatePEM: String

    public static let idTokenKeysPath = "/robot/v1/metadata/x509/securetoken@system.gserviceaccount.com"
    public static let appCheckKeysPath = "/v1/jwks"

    public init(projectID: String, projectNumber: String = "123456789012") throws {
        self.projectID = projectID
        self.projectNumber = projectNumber
        idTokenKey = try RSAPrivateKey.generate()
        appCheckKey = try RSAPrivateKey.generate()
        strayKey = try RSAPrivateKey.generate()
        idTokenKeyID = Self.keyID()
        appCheckKeyID = Self.keyID()
        idTokenCertificatePEM = try idTokenKey.selfSignedCertificatePEM(commonName: "securetoken.system.gserviceaccount.com")
    }

    private static func keyID() -> String {
        String(UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "").prefix(40))
    }

    /// `{kid: certificate PEM}`, as Google publishes Firebase Auth's keys.
    public var idTokenKeySetJSON: String {
        JSONValue.object([idTokenKeyID: .string(idTokenCertificatePEM)]).serialized
    }

    /// `{"keys": [JWK]}`, as App Check publishes its keys.
    public var appCheckKeySetJSON: String {
        let publicKey = (try? RSAPublicKey(pem: appCheckKey.publicKeyPEM))?.components ?? (modulus: [], exponent: [])
        return JSONValue.object(["keys": .array([.object([
            "kty": "RSA", "use": "sig", "alg": "RS256", "kid": .string(appCheckKeyID),
            "n": .string(Base64URL.encode(publicKey.modulus)), "e": .string(Base64URL.encode(publicKey.exponent)),
        ])])]).serialized
    }

    /// The claims of an ID token for `uid`, issued at `issuedAt`, valid an hour.
    public func idTokenClaims(uid: String, issuedAt: Date = Date()) -> [String: JSONValue] {
        let iat = Int(issuedAt.timeIntervalSince1970)
        return ["iss": .string("https://securetoken.google.com/" + projectID), "aud": .string(projectID), "auth_time": .number(JSONNumber(iat)),
                "user_id": .string(uid), "sub": .string(uid), "iat": .number(JSONNumber(iat)), "exp": .number(JSONNumber(iat + 3600)),
                "firebase": .object(["identities": .object([:]), "sign_in_provider": "anonymous"])]
    }

    /// The claims of an App Check token for `appID`, issued at `issuedAt`, valid an hour.
    public func appCheckClaims(appID: String, issuedAt: Date = Date()) -> [String: JSONValue] {
        let iat = Int(issuedAt.timeIntervalSince1970)
        return ["iss": .string("https://firebaseappcheck.googleapis.com/" + projectNumber), "sub": .string(appID),
                "aud": .array([.string("projects/" + projectNumber), .string("projects/" + projectID)]),
                "iat": .number(JSONNumber(iat)), "exp": .number(JSONNumber(iat + 3600))]
    }

    /// A Firebase Auth ID token for `uid`.
    public func idToken(uid: String, issuedAt: Date = Date()) throws -> String {
        try sign(idTokenClaims(uid: uid, issuedAt: issuedAt), kind: .idToken)
    }

    /// An App Check token for the app `appID` (`1:<number>:android:<hex>`).
    public func appCheckToken(appID: String, issuedAt: Date = Date()) throws -> String {
        try sign(appCheckClaims(appID: appID, issuedAt: issuedAt), kind: .appCheck)
    }

    /// `claims` signed with the key of `kind` (or, `stray`, a key no set publishes).
    public func sign(_ claims: [String: JSONValue], kind: FirebaseTokenRules.Kind, stray: Bool = false) throws -> String {
        guard !stray else { return try JSONWebToken.signed(claims: .object(claims), keyID: "unpublished-key", key: strayKey) }
        return try JSONWebToken.signed(claims: .object(claims), keyID: kind == .idToken ? idTokenKeyID : appCheckKeyID,
                                       key: kind == .idToken ? idTokenKey : appCheckKey)
    }

    /// The app id the simulator's devices use.
    public var sampleAppID: String { "1:\(projectNumber):android:0a1b2c3d4e5f6a7b" }

    /// One token of the corpus the outside check runs: its name, kind and text, and whether
    /// Firebase's rules accept it.
    public struct CorpusToken: Sendable {
        public let name: String
        public let kind: FirebaseTokenRules.Kind
        public let token: String
        /// Whether the worker accepts it.
        public let valid: Bool
        /// The worker refuses it though firebase-admin accepts it: a check stricter by design
        /// (docs/ingress.md lists them).
        public let stricter: Bool
    }

    /// Good and bad tokens of both kinds: expired, not yet valid, wrong `aud`, wrong `iss`,
    /// an unknown `kid`, `alg: none`, HS256 signed with the public key, a flipped signature
    /// bit, a token 10 KB long (valid), an empty `sub`, a `sub` of 128 and of 129 Unicode
    /// scalars, an App Check `aud` naming only the project's number, an App Check token
    /// expired 4 s ago; and the checks stricter by design (`stricter`): a future `auth_time`
    /// or `nbf`, an App Check token without `exp`.
    public func corpus(now: Date = Date()) throws -> [CorpusToken] {
        var tokens: [CorpusToken] = []
        for kind in [FirebaseTokenRules.Kind.idToken, .appCheck] {
            let base = kind == .idToken ? idTokenClaims(uid: "corpus-user", issuedAt: now - 60) : appCheckClaims(appID: sampleAppID, issuedAt: now - 60)
            func add(_ name: String, _ valid: Bool, _ token: String, stricter: Bool = false) {
                tokens.append(CorpusToken(name: kind.rawValue + "/" + name, kind: kind, token: token, valid: valid, stricter: stricter))
            }
            func with(_ changes: [String: JSONValue]) -> [String: JSONValue] { base.merging(changes) { $1 } }
            let good = try sign(base, kind: kind)
            add("good", true, good)
            let past = Int(now.timeIntervalSince1970) - 7200, future = Int(now.timeIntervalSince1970) + 3600
            add("expired", false, try sign(with(["iat": .number(JSONNumber(past)), "exp": .number(JSONNumber(past + 3600)),
                                                 "auth_time": .number(JSONNumber(past))].filter { kind == .idToken || $0.key != "auth_time" }), kind: kind))
            add("not-yet-valid", false, try sign(with(["iat": .number(JSONNumber(future)), "nbf": .number(JSONNumber(future)),
                                                       "exp": .number(JSONNumber(future + 3600))]), kind: kind))
            add("wrong-aud", false, try sign(with(["aud": kind == .idToken ? "another-project" : .array(["projects/999", "projects/another-project"])]),
                                             kind: kind))
            add("wrong-iss", false, try sign(with(["iss": kind == .idToken ? "https://securetoken.google.com/another-project"
                                                                          : "https://accounts.google.com/"]), kind: kind))
            add("unknown-kid", false, try sign(base, kind: kind, stray: true))
            // firebase-admin refuses an ID token's empty sub, and takes an App Check token's.
            add("empty-sub", kind == .appCheck, try sign(with(["sub": ""]), kind: kind))
            let parts = good.split(separator: ".").map(String.init)
            let noneHeader = Base64URL.encode(Array(#"{"alg":"none","kid":"\#(kind == .idToken ? idTokenKeyID : appCheckKeyID)","typ":"JWT"}"#.utf8))
            add("alg-none", false, noneHeader + "." + parts[1] + ".")
            let hsHeader = Base64URL.encode(Array(#"{"alg":"HS256","kid":"\#(kind == .idToken ? idTokenKeyID : appCheckKeyID)","typ":"JWT"}"#.utf8))
            let publicPEM = kind == .idToken ? idTokenCertificatePEM : appCheckKey.publicKeyPEM
            add("hs256-public-key", false, hsHeader + "." + parts[1] + "." + Base64URL.encode(Self.hmacSHA256(key: Array(publicPEM.utf8),
                                                                                                                 data: Array((hsHeader + "." + parts[1]).utf8))))
            var signature = Base64URL.decode(parts[2]) ?? []
            signature[signature.count / 2] ^= 0x01
            add("flipped-bit", false, parts[0] + "." + parts[1] + "." + Base64URL.encode(signature))
            add("long-10kb", true, try sign(with(["padding": .string(String(repeating: "x", count: 7600))]), kind: kind))
            if kind == .idToken {
                // sub counted in Unicode scalars (as Python's len), not characters: 64 "é" written
                // as e and a combining accent are 128 scalars (taken), one more is 129 (refused).
                let accented = String(repeating: "e\u{0301}", count: 64)
                add("sub-128-scalars", true, try sign(with(["sub": .string(accented), "user_id": .string(accented)]), kind: kind))
                add("sub-129-scalars", false, try sign(with(["sub": .string(accented + "a"), "user_id": .string(accented + "a")]), kind: kind))
                // Stricter by design: a time that has not come yet is refused.
                add("future-auth-time", false, try sign(with(["auth_time": .number(JSONNumber(future))]), kind: kind), stricter: true)
                add("future-nbf", false, try sign(with(["nbf": .number(JSONNumber(future))]), kind: kind), stricter: true)
            } else {
                add("aud-project-number-only", false, try sign(with(["aud": .array([.string("projects/" + projectNumber)])]), kind: kind))
                // No clock skew for App Check: expired 4 s ago is expired.
                let recent = Int(now.timeIntervalSince1970)
                add("expired-4s-ago", false, try sign(with(["iat": .number(JSONNumber(recent - 3604)), "exp": .number(JSONNumber(recent - 4))]),
                                                      kind: kind))
                // Stricter by design: a token that never expires is refused.
                add("no-exp", false, try sign(base.filter { $0.key != "exp" }, kind: kind), stricter: true)
            }
        }
        return tokens
    }

    private static func hmacSHA256(key: [UInt8], data: [UInt8]) -> [UInt8] {
        var output = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 32
        _ = HMAC(EVP_sha256(), key, Int32(key.count), data, data.count, &output, &length)
        return Array(output.prefix(Int(length)))
    }
}
