import FCM
import Foundation
import Transport

/// Who a verified token says posted: the user's uid (ID token) or the app's id (App Check
/// token), and when the token stops being valid.
public struct VerifiedToken: Sendable, Equatable {
    public let subject: String
    public let expiresAt: Date
}

/// Checks Firebase tokens against the rules and the published keys, as firebase-admin
/// does: RS256 only, a `kid` of the key set, the signature, then the claims. Pure: the key
/// set and the time are given.
public enum FirebaseTokenVerifier {
    /// - Throws: `TokenRefusal` with the first rule the token breaks.
    public static func verify(_ text: String, rules: FirebaseTokenRules, keys: FirebaseKeySet?, now: Date) throws(TokenRefusal) -> VerifiedToken {
        let token = try JSONWebToken(text)
        guard token.header["alg"]?.stringValue == "RS256" else {
            throw TokenRefusal(.unsupportedAlgorithm, "alg is \(token.header["alg"]?.stringValue.map { "\"\($0.prefix(16))\"" } ?? "missing"), "
                               + "only RS256 is accepted")
        }
        guard let kid = token.header["kid"]?.stringValue, !kid.isEmpty else {
            throw TokenRefusal(.unsupportedAlgorithm, "the header has no kid")
        }
        if rules.kind == .appCheck && token.header["typ"]?.stringValue != "JWT" {
            throw TokenRefusal(.unsupportedAlgorithm, "an App Check token's header must say typ JWT")
        }
        guard let keys else { throw TokenRefusal(.keysUnavailable, "the signing keys could not be fetched yet") }
        guard let key = keys.keys[kid] else { throw TokenRefusal(.unknownKey, "no published key has kid \"\(kid.prefix(64))\"") }
        guard key.verifySHA256(token.signingInput, signature: token.signature) else {
            throw TokenRefusal(.badSignature, "the signature does not verify with key \(kid.prefix(64))")
        }
        return try checkClaims(of: token, rules: rules, now: now)
    }

    /// The claims' checks, after the signature.
    static func checkClaims(of token: JSONWebToken, rules: FirebaseTokenRules, now: Date) throws(TokenRefusal) -> VerifiedToken {
        let skew = Double(rules.toleratedSkew.components.seconds)
        let clock = now.timeIntervalSince1970
        switch rules.kind {
        case .idToken:
            guard token.string("aud") == rules.projectID else {
                throw TokenRefusal(.wrongAudience, "aud is not the project \(rules.projectID)")
            }
            guard token.string("iss") == rules.idTokenIssuer else {
                throw TokenRefusal(.wrongIssuer, "iss is not \(rules.idTokenIssuer)")
            }
        case .appCheck:
            let audiences = token.claims["aud"]?.arrayValue?.compactMap(\.stringValue) ?? []
            // Only the project's id: `projects/<number>` alone is refused, as firebase-admin refuses it.
            guard audiences.contains("projects/" + rules.projectID) else {
                throw TokenRefusal(.wrongAudience, "aud does not list projects/\(rules.projectID)")
            }
            let issuer = FirebaseTokenRules.appCheckIssuerPrefix + (rules.projectNumber ?? "")
            guard let iss = token.string("iss"), rules.projectNumber == nil ? iss.hasPrefix(issuer) : iss == issuer else {
                throw TokenRefusal(.wrongIssuer, "iss is not \(issuer)\(rules.projectNumber == nil ? "…" : "")")
            }
        }
        guard let exp = token.seconds("exp") else { throw TokenRefusal(.malformed, "the token has no exp") }
        guard exp + skew >= clock else { throw TokenRefusal(.expired, "the token expired \(Int(clock - exp)) s ago") }
        if rules.kind == .idToken && token.seconds("iat") == nil { throw TokenRefusal(.malformed, "the token has no iat") }
        for claim in ["iat", "auth_time", "nbf"] {
            if let time = token.seconds(claim), time - skew > clock {
                throw TokenRefusal(.notYetValid, "\(claim) is \(Int(time - clock)) s in the future")
            }
        }
        // firebase-admin: an ID token's sub is 1 to 128 characters (the uid), counted as Python
        // counts a string: Unicode scalars, not grapheme clusters; an App Check token's sub
        // need only be a string.
        guard let subject = token.string("sub") else { throw TokenRefusal(.badSubject, "sub is missing or not a string") }
        if rules.kind == .idToken && (subject.isEmpty || subject.unicodeScalars.count > 128) {
            throw TokenRefusal(.badSubject, subject.isEmpty ? "sub is empty" : "sub is over 128 characters")
        }
        return VerifiedToken(subject: subject, expiresAt: Date(timeIntervalSince1970: exp))
    }
}
