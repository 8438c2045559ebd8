import FCM
import Foundation
import Transport

/// Published signing keys by key id: Firebase Auth's X.509 certificates (`{kid: PEM}`) or
/// App Check's JWK set (`{"keys": [{kid, kty: RSA, n, e, …}]}`).
public struct FirebaseKeySet: Sendable {
    public let keys: [String: RSAPublicKey]

    public init(keys: [String: RSAPublicKey]) {
        self.keys = keys
    }

    /// Reads either published form. Keys that cannot be read (not RSA, a bad certificate)
    /// are left out; a set with none at all is refused.
    /// - Throws: `FirebaseKeySet.Unreadable` saying what is wrong with the document.
    public init(json: String) throws(Unreadable) {
        guard case .object(let members)? = try? JSONValue.parse(json) else { throw Unreadable("the key set is not a JSON object") }
        var keys: [String: RSAPublicKey] = [:]
        if case .array(let jwks)? = members["keys"] {
            for case .object(let jwk) in jwks {
                guard jwk["kty"]?.stringValue == "RSA", let kid = jwk["kid"]?.stringValue,
                      let n = jwk["n"]?.stringValue.flatMap(Base64URL.decode), let e = jwk["e"]?.stringValue.flatMap(Base64URL.decode),
                      let key = try? RSAPublicKey(modulus: n, exponent: e) else { continue }
                keys[kid] = key
            }
        } else {
            for (kid, value) in members {
                guard let pem = value.stringValue, let key = try? RSAPublicKey(certificatePEM: pem) else { continue }
                keys[kid] = key
            }
        }
        guard !keys.isEmpty else { throw Unreadable("the key set holds no usable RSA key") }
        self.keys = keys
    }

    public struct Unreadable: Error, CustomStringConvertible, Sendable {
        public let description: String
        init(_ description: String) { self.description = description }
    }
}
