import Foundation
import Runtime

/// Who posted, as the tokens proved it: the Firebase user (ID token) and the app (App
/// Check token), each nil when that token was not required.
public struct IngressIdentity: Sendable, Equatable {
    public var uid: String?
    public var appID: String?

    public init(uid: String? = nil, appID: String? = nil) {
        self.uid = uid
        self.appID = appID
    }
}

/// Checks a request's tokens against the required kinds. A token verified once is
/// remembered until it expires (a device posts many messages with one token; the RSA
/// check is the costly part), in a table bounded at `cacheSize` that is emptied of expired
/// tokens, or entirely, when full.
public final class IngressAuthenticator: Sendable {
    public struct Failure: Error, Sendable {
        public let refusal: TokenRefusal
        public let kind: FirebaseTokenRules.Kind
    }

    private let checks: [(rules: FirebaseTokenRules, keys: FirebaseKeySource)]
    private let verified = BlockingLock<[String: VerifiedToken]>([:])
    private let cacheSize: Int

    public init(checks: [(rules: FirebaseTokenRules, keys: FirebaseKeySource)], cacheSize: Int = 10_000) {
        self.checks = checks
        self.cacheSize = cacheSize
    }

    public var keySources: [FirebaseKeySource] { checks.map(\.keys) }

    /// Verifies the tokens the rules require: `bearer` (the `Authorization` header's value)
    /// for ID tokens, `appCheck` for App Check tokens.
    public func authenticate(authorization: String?, appCheck: String?, now: Date = Date()) -> Result<IngressIdentity, Failure> {
        var identity = IngressIdentity()
        for check in checks {
            let token: String?
            switch check.rules.kind {
            case .idToken:
                token = authorization.flatMap { header in
                    header.count > 7 && header.prefix(7).lowercased() == "bearer " ? String(header.dropFirst(7)).trimmingCharacters(in: .whitespaces) : nil
                }
            case .appCheck:
                token = appCheck
            }
            guard let token, !token.isEmpty else {
                return .failure(Failure(refusal: TokenRefusal(.missing, check.rules.kind == .idToken
                    ? "no Authorization: Bearer ID token" : "no X-Firebase-AppCheck token"), kind: check.rules.kind))
            }
            let cacheKey = check.rules.kind.rawValue + " " + token
            var subject: String
            if let known = verified.withLock({ $0[cacheKey] }), known.expiresAt.timeIntervalSince(now) > -Double(check.rules.clockSkew.components.seconds) {
                subject = known.subject
            } else {
                do {
                    let token = try FirebaseTokenVerifier.verify(token, rules: check.rules, keys: check.keys.keys, now: now)
                    subject = token.subject
                    remember(cacheKey, token, now: now)
                } catch {
                    if error.reason == .unknownKey { check.keys.refreshEarly() }
                    return .failure(Failure(refusal: error, kind: check.rules.kind))
                }
            }
            switch check.rules.kind {
            case .idToken: identity.uid = subject
            case .appCheck: identity.appID = subject
            }
        }
        return .success(identity)
    }

    private func remember(_ key: String, _ token: VerifiedToken, now: Date) {
        verified.withLock { table in
            if table.count >= cacheSize {
                table = table.filter { $0.value.expiresAt > now }
                if table.count >= cacheSize { table.removeAll(keepingCapacity: true) }
            }
            table[key] = token
        }
    }
}
