import FCM
import Foundation
import Transport

/// A compact JWS (`header.payload.signature`, base64url) taken apart, nothing checked yet:
/// `FirebaseTokenVerifier` checks it. Parsing is bounded: a token over `maximumLength`
/// characters is refused before any decoding.
public struct JSONWebToken: Sendable {
    /// The longest token read: Firebase's are about 1 KB, and an HTTP header cannot be
    /// longer than the server's 16 KiB head limit.
    public static let maximumLength = 16 * 1024

    public let header: [String: JSONValue]
    public let claims: [String: JSONValue]
    /// What the signature covers: the first two parts, as sent.
    public let signingInput: [UInt8]
    public let signature: [UInt8]

    /// Takes `text` apart.
    /// - Throws: `TokenRefusal` (`malformed`) saying which part is wrong.
    public init(_ text: String) throws(TokenRefusal) {
        guard text.utf8.count <= Self.maximumLength else {
            throw TokenRefusal(.malformed, "the token is over \(Self.maximumLength) bytes")
        }
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else { throw TokenRefusal(.malformed, "a JWT has three parts, this has \(parts.count)") }
        guard let headerBytes = Base64URL.decode(String(parts[0])),
              case .object(let header)? = try? JSONValue.parse(String(decoding: headerBytes, as: UTF8.self)) else {
            throw TokenRefusal(.malformed, "the header is not base64url JSON")
        }
        guard let claimBytes = Base64URL.decode(String(parts[1])),
              case .object(let claims)? = try? JSONValue.parse(String(decoding: claimBytes, as: UTF8.self)) else {
            throw TokenRefusal(.malformed, "the payload is not base64url JSON")
        }
        guard let signature = Base64URL.decode(String(parts[2])) else {
            throw TokenRefusal(.malformed, "the signature is not base64url")
        }
        self.header = header
        self.claims = claims
        self.signingInput = Array(text.utf8.prefix(parts[0].utf8.count + 1 + parts[1].utf8.count))
        self.signature = signature
    }

    /// A claim as a string.
    public func string(_ name: String) -> String? { claims[name]?.stringValue }

    /// A claim as a number of seconds since 1970 (an integer or a fraction).
    public func seconds(_ name: String) -> Double? {
        if case .number(let number)? = claims[name] { return number.doubleValue }
        return nil
    }

    /// Signs `claims` with RS256 (header `alg`, `kid`, `typ: JWT`): what the simulator mints
    /// for devices and tests.
    public static func signed(claims: JSONValue, keyID: String, key: RSAPrivateKey) throws(TransportError) -> String {
        let header = JSONValue.object(["alg": "RS256", "kid": .string(keyID), "typ": "JWT"])
        let input = Base64URL.encode(Array(header.serialized.utf8)) + "." + Base64URL.encode(Array(claims.serialized.utf8))
        return input + "." + Base64URL.encode(try key.signSHA256(Array(input.utf8)))
    }
}
