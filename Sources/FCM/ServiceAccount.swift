import Foundation
import Runtime
import Transport

/// A Google service account, as its JSON key file holds it (the file Google's tools find
/// through `GOOGLE_APPLICATION_CREDENTIALS`): what the worker needs to get OAuth2 access
/// tokens for FCM's HTTP v1 API.
///
/// Its description never shows the private key.
public struct ServiceAccount: Sendable, CustomStringConvertible {
    /// The scope FCM's send API requires.
    public static let messagingScope = "https://www.googleapis.com/auth/firebase.messaging"
    /// The audience Google's token endpoint expects in an assertion, whatever `token_uri` names.
    public static let googleTokenAudience = "https://oauth2.googleapis.com/token"

    public let projectID: String
    public let clientEmail: String
    public let privateKeyID: String
    /// Where assertions are exchanged for access tokens (Google's, or the simulator's).
    public let tokenURI: String
    let privateKey: RSAPrivateKey

    /// Why a service-account file is unusable; never quotes the key.
    public struct Invalid: Error, Sendable, Equatable, CustomStringConvertible {
        public let description: String
        public init(_ description: String) { self.description = description }
    }

    /// Reads the JSON of a service-account key file.
    /// - Throws: `Invalid` naming the missing or malformed member.
    public init(json text: String) throws(Invalid) {
        guard case .object(let members)? = try? JSONValue.parse(text) else {
            throw Invalid("it is not a JSON object (a service-account key file is)")
        }
        if let type = members["type"]?.stringValue, type != "service_account" {
            throw Invalid("its type is \(type), not service_account (download a key of a service account from the Firebase console)")
        }
        func member(_ name: String) throws(Invalid) -> String {
            guard let value = members[name]?.stringValue, !value.isEmpty else { throw Invalid("it has no \(name)") }
            return value
        }
        projectID = try member("project_id")
        clientEmail = try member("client_email")
        privateKeyID = members["private_key_id"]?.stringValue ?? ""
        tokenURI = members["token_uri"]?.stringValue ?? Self.googleTokenAudience
        guard tokenURI.hasPrefix("https://") else { throw Invalid("its token_uri is not an https URL") }
        do {
            privateKey = try RSAPrivateKey(pem: try member("private_key"))
        } catch let error as Invalid {
            throw error
        } catch {
            throw Invalid("its private_key is not an RSA private key in PEM")
        }
    }

    /// Reads a service-account key file.
    /// - Throws: `Invalid` saying the file cannot be read or what is wrong in it.
    public init(file path: String) throws(Invalid) {
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw Invalid("cannot read the service-account file \(path): \((error as NSError).localizedDescription)")
        }
        do {
            try self.init(json: text)
        } catch {
            throw Invalid("the service-account file \(path) is unusable: \(error)")
        }
    }

    /// A service account made here (the simulator's), with a new key.
    public init(projectID: String, clientEmail: String, privateKeyID: String, tokenURI: String, privateKey: RSAPrivateKey) {
        self.projectID = projectID
        self.clientEmail = clientEmail
        self.privateKeyID = privateKeyID
        self.tokenURI = tokenURI
        self.privateKey = privateKey
    }

    /// The key file's JSON, as Google's console writes it (the private key included).
    public var keyFileJSON: String {
        JSONValue.object([
            "type": "service_account", "project_id": .string(projectID), "private_key_id": .string(privateKeyID),
            "private_key": .string(privateKey.pkcs8PEM), "client_email": .string(clientEmail),
            "client_id": "000000000000000000000", "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": .string(tokenURI),
        ]).serialized
    }

    /// Its public key, PEM (what Google publishes for the key id).
    public var publicKeyPEM: String { privateKey.publicKeyPEM }

    public var description: String { "service account \(clientEmail) of project \(projectID)" }

    /// A signed JWT asserting this account for `scope`, issued at `now` and valid one hour
    /// (the longest Google accepts), for the JWT-bearer grant.
    /// - Throws: `Invalid` if OpenSSL cannot sign with the key.
    public func assertion(scope: String = ServiceAccount.messagingScope, now: Date = Date()) throws(Invalid) -> String {
        let issued = Int(now.timeIntervalSince1970)
        var header: [String: JSONValue] = ["alg": "RS256", "typ": "JWT"]
        if !privateKeyID.isEmpty { header["kid"] = .string(privateKeyID) }
        let claims: JSONValue = .object([
            "iss": .string(clientEmail), "scope": .string(scope), "aud": .string(Self.googleTokenAudience),
            "iat": .number(JSONNumber(issued)), "exp": .number(JSONNumber(issued + 3600)),
        ])
        let signingInput = Base64URL.encode(Array(JSONValue.object(header).serialized.utf8)) + "."
            + Base64URL.encode(Array(claims.serialized.utf8))
        do {
            return signingInput + "." + Base64URL.encode(try privateKey.signSHA256(Array(signingInput.utf8)))
        } catch {
            throw Invalid("cannot sign with the service account's key: \(error)")
        }
    }
}
