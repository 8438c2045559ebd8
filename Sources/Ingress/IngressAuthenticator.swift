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
    /// Per check (one per kind): tokens verified, by their text.
    private let verified: [BlockingLock<[TokenKey: VerifiedToken]>]
    private let cacheSize: Int

    public init(checks: [(rules: FirebaseTokenRules, keys: FirebaseKeySource)], cacheSize: Int = 10_000) {
        self.checks = checks
        self.verified = checks.map { _ in BlockingLock([:]) }
        self.cacheSize = cacheSize
    }

    public var keySources: [FirebaseKeySource] { checks.map(\.keys) }

    /// Verifies the tokens the rules require: `bearer` (the `Authorization` header's value)
    /// for ID tokens, `appCheck` for App Check tokens.
    public func authenticate(authorization: String?, appCheck: String?, now: Date = Date()) -> Result<IngressIdentity, Failure> {
        var identity = IngressIdentity()
        for (index, check) in checks.enumerated() {
            // The header as sent is the cache's key: a hit copies nothing out of it.
            let header = check.rules.kind == .idToken ? authorization : appCheck
            guard let header, !header.isEmpty else { return .failure(Self.missing(check.rules.kind)) }
            // A table per kind: a token verified as one kind is never taken as the other.
            let cache = verified[index]
            let key = TokenKey(header)
            var subject: String
            if let known = cache.withLock({ $0[key] }), known.expiresAt.timeIntervalSince(now) > -Double(check.rules.toleratedSkew.components.seconds) {
                subject = known.subject
            } else {
                let token = check.rules.kind == .idToken ? Self.bearerToken(header) : header
                guard let token, !token.isEmpty else { return .failure(Self.missing(check.rules.kind)) }
                do {
                    let verified = try FirebaseTokenVerifier.verify(token, rules: check.rules, keys: check.keys.keys, now: now)
                    subject = verified.subject
                    remember(key, verified, in: cache, now: now)
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

    /// The refusal of a request without a token of `kind` (made only then: its text is not
    /// built for every request).
    private static func missing(_ kind: FirebaseTokenRules.Kind) -> Failure {
        Failure(refusal: TokenRefusal(.missing, kind == .idToken ? "no Authorization: Bearer ID token" : "no X-Firebase-AppCheck token"),
                kind: kind)
    }

    /// The token of an `Authorization: Bearer TOKEN` value (the scheme in any case, spaces
    /// around the token dropped), read as bytes: a token is about a kilobyte, and walking it
    /// as characters (or through Foundation's trimming) cost more than the rest of a request.
    static func bearerToken(_ header: String) -> String? {
        var header = header
        return header.withUTF8 { bytes -> String? in
            let scheme: [UInt8] = Array("bearer ".utf8)
            guard bytes.count > scheme.count else { return nil }
            for index in scheme.indices where bytes[index] | 0x20 != scheme[index] { return nil }
            var start = scheme.count, end = bytes.count
            while start < end && (bytes[start] == 0x20 || bytes[start] == 0x09) { start += 1 }
            while end > start && (bytes[end - 1] == 0x20 || bytes[end - 1] == 0x09) { end -= 1 }
            guard start < end else { return nil }
            return String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<end]), as: UTF8.self)
        }
    }

    private func remember(_ key: TokenKey, _ token: VerifiedToken, in cache: BlockingLock<[TokenKey: VerifiedToken]>, now: Date) {
        cache.withLock { table in
            if table.count >= cacheSize {
                table = table.filter { $0.value.expiresAt > now }
                if table.count >= cacheSize { table.removeAll(keepingCapacity: true) }
            }
            table[key] = token
        }
    }
}

/// A token header's text as a key of the verified-token cache: hashed by its length and
/// last 32 bytes, compared in full, byte for byte (never as Swift strings: those compare by
/// canonical equivalence, and a token with `K` replaced by U+212A KELVIN SIGN would then be
/// taken for the verified one). The tail is part of the token's signature, which differs
/// between any two tokens that verified; hashing a kilobyte-long token whole cost more than
/// the rest of the lookup. Only verified tokens are stored, so a client cannot fill a
/// bucket with tokens made to share a tail.
struct TokenKey: Hashable, Sendable {
    let text: String

    init(_ text: String) { self.text = text }

    static func == (a: TokenKey, b: TokenKey) -> Bool {
        var first = a.text, second = b.text
        return first.withUTF8 { x in
            second.withUTF8 { y in x.count == y.count && (x.isEmpty || memcmp(x.baseAddress!, y.baseAddress!, x.count) == 0) }
        }
    }

    func hash(into hasher: inout Hasher) {
        var text = text
        text.withUTF8 { bytes in
            hasher.combine(bytes.count)
            hasher.combine(bytes: UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: bytes[max(0, bytes.count - 32)...])))
        }
    }
}
