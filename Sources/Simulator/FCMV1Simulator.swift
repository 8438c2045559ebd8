import FCM
import Foundation
import Runtime
import Transport
#if canImport(Glibc)
import Glibc
#endif

/// A stand-in for FCM's HTTP v1 API and Google's OAuth2 token endpoint, over HTTPS on
/// loopback, HTTP/2 (ALPN `h2`) or HTTP/1.1 as the client offers.
///
/// - `POST /token`: the JWT-bearer grant. The assertion's RS256 signature is checked
///   against the service account's public key, and its claims as Google checks them: `iss`
///   the account's email, a `scope` FCM accepts, `aud` Google's token URL (or this
///   endpoint's), `iat` not in the future, `exp` after now and at most an hour after `iat`.
///   It answers an access token valid `tokenLifetime`; a refused grant is a 400
///   `invalid_grant` as Google's.
/// - `POST /v1/projects/{project}/messages:send`: a valid, unexpired token (else 401
///   `UNAUTHENTICATED`), the account's project (else 403 `PERMISSION_DENIED`), a message FCM
///   would accept (else 400 `INVALID_ARGUMENT` with the field violation; to an Apple token,
///   `isAppleToken`, `apns-priority: 10` on a message that does not alert the user is
///   refused as Apple and FCM refuse it), then each target as `targetAnswer` says (success
///   with the message's name, `UNREGISTERED`, `SENDER_ID_MISMATCH`, `THIRD_PARTY_AUTH_ERROR`,
///   `APNS_AUTH_ERROR`, `INVALID_ARGUMENT`, a device's or the project's quota). A project
///   quota (`quotaPerMinute` per `quotaWindow`) and a device quota (`deviceQuota`) answer
///   429 as Google does: `RESOURCE_EXHAUSTED` with a `google.rpc.QuotaFailure` naming the
///   project or the device, and either FCM's `QUOTA_EXCEEDED` or (`quotaShape`) a
///   `google.rpc.ErrorInfo`; with `Retry-After` or (`quotaRetryAfter` off) without.
/// - The token endpoint can be told to fail transiently (`scriptTokenEndpoint`): 5xx, 408,
///   429 or a 400 `temporarily_unavailable`, as Google's does under load.
///   `validate_only` is checked like a send and answered with `…/messages/fake_message_id`,
///   delivering nothing.
/// - Tests queue whole-request outcomes ahead (`scriptNext`): a status (5xx bursts, 429), a
///   reset stream, a dropped connection, no answer, a GOAWAY; and set an answer latency.
public final class FCMV1Simulator: Sendable {
    /// How a send to one target is answered.
    public enum TargetAnswer: Sendable, Equatable {
        case success
        /// 404 `UNREGISTERED`: the app instance is gone.
        case unregistered
        /// 403 `SENDER_ID_MISMATCH`: the token belongs to another sender.
        case senderMismatch
        /// 400 `INVALID_ARGUMENT`: not a valid registration token.
        case invalidToken
        /// 401 `THIRD_PARTY_AUTH_ERROR`: APNs or web push refused the project's credentials.
        case thirdPartyAuthError
        /// 401 `APNS_AUTH_ERROR`: the older name of the same refusal.
        case apnsAuthError
        /// 429 `QUOTA_EXCEEDED` with `Retry-After: 1`: the device's message rate was exceeded.
        case quotaExceeded
        /// 429 `QUOTA_EXCEEDED` for the project's message rate (no `Retry-After`).
        case projectQuotaExceeded
    }

    /// How a project-quota 429 is written.
    public enum QuotaShape: Sendable, Equatable {
        /// `RESOURCE_EXHAUSTED` with FCM's `QUOTA_EXCEEDED` and a `google.rpc.QuotaFailure`.
        case fcmError
        /// `RESOURCE_EXHAUSTED` with a `google.rpc.ErrorInfo` (`RATE_LIMIT_EXCEEDED`) and a
        /// `google.rpc.QuotaFailure`, no FCM code: as Google's API front end answers.
        case errorInfo
    }

    /// A whole request's outcome, ahead of the normal answer.
    public enum Scripted: Sendable, Equatable {
        /// This status with its canonical error (`QUOTA_EXCEEDED` for 429, `UNAVAILABLE` for
        /// 503, `INTERNAL` for 500), and `Retry-After` when given. The message is not delivered.
        case status(Int, retryAfter: String? = nil)
        /// HTTP/2: the stream is reset after the message was delivered (HTTP/1.1: the connection closes).
        case resetAfterDelivering
        /// The connection is dropped after the message was delivered, without an answer.
        case dropAfterDelivering
        /// Delivered, never answered.
        case hold
        /// Answered normally, with a GOAWAY at once naming this stream the last processed.
        case goAway
        /// Answered as usual (to script an outcome for a later request).
        case asUsual
    }

    /// A message the simulator accepted (and delivered unless `validateOnly`).
    public struct Delivery: Sendable, Equatable {
        public let name: String
        public let message: JSONValue
        public let validateOnly: Bool
        /// `h2` or `http/1.1`.
        public let protocolName: String
        /// The request's headers but `authorization` (names lower-cased).
        public let headers: [String: String]
    }

    /// A token-endpoint answer ahead of the normal one.
    public enum TokenScripted: Sendable, Equatable {
        /// This status, with `{"error": error}` when given (a 400 `temporarily_unavailable`,
        /// `internal_failure`, `server_error`, or a refusal such as `invalid_grant`).
        case status(Int, error: String? = nil)
    }

    /// What the simulator counted.
    public struct Counters: Sendable, Equatable {
        public var tokensIssued = 0
        public var grantsRefused = 0
        public var sendRequests = 0
        public var delivered = 0
        public var connections = 0
        /// 429s answered for a quota (the project's or a device's).
        public var quotaRefusals = 0
        /// Token-endpoint requests answered with a scripted failure.
        public var tokenFailures = 0
    }

    private struct State {
        var scripted: [Scripted] = []
        var tokenScripted: [TokenScripted] = []
        var deviceWindows: [String: (start: Date, count: Int)] = [:]
        var deliveries: [Delivery] = []
        var tokens: [String: Date] = [:]
        var counters = Counters()
        var nextMessageID: Int64 = 0
        var quotaWindow: (start: Date, count: Int) = (.distantPast, 0)
        /// The account's keys by id (Google keeps up to 10 per account), and those revoked.
        var keys: [String: RSAPublicKey] = [:]
        var revokedKeys: Set<String> = []
        var grantKeyIDs: [String] = []
    }

    public let port: Int
    /// The service account, with the key made at start.
    public let account: ServiceAccount
    /// The URL of the token endpoint (the account's `token_uri`).
    public let tokenURI: String
    /// Firebase's token services: the ID and App Check tokens devices present to an ingress,
    /// and the keys that check them, served at `idTokenKeysURL` and `appCheckKeysURL`.
    public let firebaseTokens: FirebaseTokenIssuer
    public let idTokenKeysURL: String
    public let appCheckKeysURL: String
    /// The 16 hex digits after `%` in the message names.
    private let senderHash = String(UInt64.random(in: 1 << 60 ... UInt64.max), radix: 16)
    private let context: TLSContext
    private let acceptLoop: AcceptLoop
    private let state = BlockingLock(State())
    private let settings: Settings

    /// How it answers.
    public struct Settings: Sendable {
        public var projectID = "fcm-worker-simulator"
        public var host = "127.0.0.1"
        public var port = 0
        /// False: only HTTP/1.1 is offered by ALPN (the client's fallback).
        public var offersHTTP2 = true
        public var maximumConcurrentStreams: UInt32 = 100
        /// Every answer waits this long.
        public var latency: Duration = .zero
        public var tokenLifetime: Duration = .seconds(3600)
        /// Sends accepted per `quotaWindow` for the project before 429 `QUOTA_EXCEEDED` (nil:
        /// no quota).
        public var quotaPerMinute: Int?
        /// The project quota's window (FCM's: a minute, not aligned to the clock).
        public var quotaWindow: Duration = .seconds(60)
        /// Sends accepted per `quotaWindow` to one device before 429 (nil: no device quota).
        public var deviceQuota: Int?
        /// Whether quota 429s carry `Retry-After` (the seconds left in the window).
        public var quotaRetryAfter = true
        /// How a project-quota 429 is written.
        public var quotaShape: QuotaShape = .fcmError
        /// A GOAWAY after every this many requests on a connection (nil: never).
        public var goAwayEvery: Int?
        public var targetAnswer: @Sendable (String) -> TargetAnswer = FCMV1Simulator.answerByName
        /// Keeps every accepted message for `deliveries` (tests read them). A long-running
        /// simulator (`fcm-worker simulate`) turns it off: it would grow without end.
        public var recordsDeliveries = true
        /// Called with each message accepted for delivery (not a `validate_only` one), on a
        /// connection's thread (the test kit's fixture awaits them).
        public var onDelivery: (@Sendable (Delivery) -> Void)?
        /// Called with each send's path, status and target (the `simulate` command logs them).
        public var onAnswer: (@Sendable (_ target: String, _ status: Int, _ protocolName: String) -> Void)?

        public init() {}
    }

    /// `unregistered-…` UNREGISTERED, `mismatch-…` SENDER_ID_MISMATCH, `invalid-…` an
    /// invalid token, `apns-refused-…` THIRD_PARTY_AUTH_ERROR, `apns-auth-error-…`
    /// APNS_AUTH_ERROR, `quota-…` a device's QUOTA_EXCEEDED, `project-quota-…` the project's,
    /// the rest success.
    public static let answerByName: @Sendable (String) -> TargetAnswer = { target in
        if target.hasPrefix("quota-") { return .quotaExceeded }
        if target.hasPrefix("project-quota-") { return .projectQuotaExceeded }
        if target.hasPrefix("apns-auth-error-") { return .apnsAuthError }
        if target.hasPrefix("unregistered-") { return .unregistered }
        if target.hasPrefix("mismatch-") { return .senderMismatch }
        if target.hasPrefix("invalid-") { return .invalidToken }
        if target.hasPrefix("apns-refused-") { return .thirdPartyAuthError }
        return .success
    }

    public init(identity: TLSIdentity, settings: Settings = Settings()) throws {
        ProcessSignals.ignoreSIGPIPE()
        self.settings = settings
        context = try TLSContext.server(identity: identity, offersHTTP2: settings.offersHTTP2)
        acceptLoop = try AcceptLoop(host: settings.host, port: settings.port)
        port = acceptLoop.port
        let host = settings.host.contains(":") ? "[\(settings.host)]" : settings.host
        tokenURI = "https://\(host):\(port)/token"
        firebaseTokens = try FirebaseTokenIssuer(projectID: settings.projectID)
        idTokenKeysURL = "https://\(host):\(port)" + FirebaseTokenIssuer.idTokenKeysPath
        appCheckKeysURL = "https://\(host):\(port)" + FirebaseTokenIssuer.appCheckKeysPath
        let key = try RSAPrivateKey.generate()
        account = ServiceAccount(projectID: settings.projectID, clientEmail: "fcm-worker@\(settings.projectID).iam.gserviceaccount.com",
                                 privateKeyID: UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: ""),
                                 tokenURI: tokenURI, privateKey: key)
        let publicKey = try RSAPublicKey(pem: key.publicKeyPEM)
        state.withLock { $0.keys[account.privateKeyID] = publicKey }
        acceptLoop.start(name: "fcm-v1-simulator accept") { [self] fd in serve(fd) }
    }

    /// Stops accepting connections (open ones go on); once it returns, the port is free.
    public func stop() {
        acceptLoop.stop()
    }

    /// True for a token the simulator treats as an Apple device's (APNs rules apply): one
    /// that starts with `ios-` or `apns-`.
    public static func isAppleToken(_ token: String) -> Bool {
        token.hasPrefix("ios-") || token.hasPrefix("apns-")
    }

    /// Queues answers for the next token-endpoint requests, in order.
    public func scriptTokenEndpoint(_ answers: [TokenScripted]) {
        state.withLock { $0.tokenScripted += answers }
    }

    /// Queues outcomes for the next send requests, in order.
    public func scriptNext(_ outcomes: [Scripted]) {
        state.withLock { $0.scripted += outcomes }
    }

    /// Every message accepted so far, in order (none when `recordsDeliveries` is off).
    public var deliveries: [Delivery] { state.withLock { $0.deliveries } }
    public var counters: Counters { state.withLock { $0.counters } }

    /// Makes every access token issued so far expired (FCM answers 401 to them).
    public func expireTokens() {
        state.withLock { state in
            for token in state.tokens.keys { state.tokens[token] = .distantPast }
        }
    }

    /// Refuses the grants signed with the key `id` (by default every key so far) from now
    /// on: the key was deleted in the console.
    public func revokeKey(id: String? = nil) {
        state.withLock { state in
            if let id { state.revokedKeys.insert(id) } else { state.revokedKeys.formUnion(state.keys.keys) }
        }
    }

    /// A new key for the account (as the console's "add key"), accepted beside the others:
    /// the account as a key file for it holds it.
    public func addKey() throws -> ServiceAccount {
        let key = try RSAPrivateKey.generate()
        let rotated = ServiceAccount(projectID: account.projectID, clientEmail: account.clientEmail,
                                     privateKeyID: UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: ""),
                                     tokenURI: tokenURI, privateKey: key)
        let publicKey = try RSAPublicKey(pem: key.publicKeyPEM)
        state.withLock { $0.keys[rotated.privateKeyID] = publicKey }
        return rotated
    }

    /// The ids of the keys whose grants were accepted, one per token issued, in order.
    public var grantKeyIDs: [String] { state.withLock { $0.grantKeyIDs } }

    // MARK: - Serving

    /// Serves one accepted connection (on threads of its own).
    private func serve(_ fd: Int32) {
        let requestsOnConnection = BlockingLock(0)
        state.withLock { $0.counters.connections += 1 }
        HTTPServerConnection.serve(fd: fd, context: context, name: "fcm-v1-simulator connection",
                                   maximumConcurrentStreams: settings.maximumConcurrentStreams) { [self] request in
            let count = requestsOnConnection.withLock { count -> Int in
                count += 1
                return count
            }
            return answer(request, numberOnConnection: count)
        }
    }

    private func answer(_ request: HTTPServerRequest, numberOnConnection: Int) -> HTTPServerAction {
        if request.method == "GET" && (request.path == FirebaseTokenIssuer.idTokenKeysPath || request.path == FirebaseTokenIssuer.appCheckKeysPath) {
            // As Google serves them: cached for hours (the ID token certificates rotate daily).
            let idToken = request.path == FirebaseTokenIssuer.idTokenKeysPath
            return respond(HTTPServerResponse(status: 200, headers: [("content-type", "application/json; charset=UTF-8"),
                                                                    ("cache-control", idToken ? "public, max-age=22013, must-revalidate, no-transform"
                                                                                              : "public, max-age=21600")],
                                              body: Array((idToken ? firebaseTokens.idTokenKeySetJSON : firebaseTokens.appCheckKeySetJSON).utf8)))
        }
        guard request.method == "POST" else { return respond(Self.googleError(405, "METHOD_NOT_ALLOWED", "only POST is served")) }
        if request.path == "/token" { return respond(grant(request)) }
        let prefix = "/v1/projects/", suffix = "/messages:send"
        guard request.path.hasPrefix(prefix), request.path.hasSuffix(suffix) else {
            return respond(Self.googleError(404, "NOT_FOUND", "The requested URL \(request.path) was not found on this server."))
        }
        let project = String(request.path.dropFirst(prefix.count).dropLast(suffix.count))
        let authorization = request.header("authorization") ?? ""
        let bearer = authorization.hasPrefix("Bearer ") ? String(authorization.dropFirst("Bearer ".count)) : nil
        // One lock a request for the script and the token (four threads serve at once).
        let (scripted, tokenExpiry) = state.withLock { state -> (Scripted?, Date?) in
            state.counters.sendRequests += 1
            return (state.scripted.isEmpty ? nil : state.scripted.removeFirst(), bearer.flatMap { state.tokens[$0] })
        }
        let goAwayNow = scripted == .goAway || settings.goAwayEvery.map { numberOnConnection % $0 == 0 } == true
        if case .status(let status, let retryAfter)? = scripted {
            var response = Self.scriptedError(status)
            if let retryAfter { response.headers.append(("retry-after", retryAfter)) }
            return respond(response)
        }
        let (response, target) = send(request, project: project, tokenExpiry: tokenExpiry)
        settings.onAnswer?(target, response.status, request.protocolName)
        switch scripted {
        case .resetAfterDelivering?: return .resetStream
        case .dropAfterDelivering?: return .dropConnection
        case .hold?: return .hold
        default: return respond(response, then: goAwayNow ? .goAway : .keepOpen)
        }
    }

    private func respond(_ response: HTTPServerResponse, then: HTTPServerAction.Afterwards = .keepOpen) -> HTTPServerAction {
        .respond(response, after: settings.latency, then: then)
    }

    // MARK: - The token endpoint

    private func grant(_ request: HTTPServerRequest) -> HTTPServerResponse {
        if let scripted = state.withLock({ state -> TokenScripted? in
            guard !state.tokenScripted.isEmpty else { return nil }
            state.counters.tokenFailures += 1
            return state.tokenScripted.removeFirst()
        }) {
            switch scripted {
            case .status(let status, let error?):
                return Self.json(status, ["error": .string(error), "error_description": .string("scripted")])
            case .status(let status, nil):
                return HTTPServerResponse(status: status, headers: [("content-type", "text/html; charset=UTF-8")],
                                          body: Array("<html><body>Error \(status)</body></html>".utf8))
            }
        }
        var fields: [String: String] = [:]
        for pair in request.bodyText.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map {
                String($0).replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? String($0)
            }
            fields[parts[0]] = parts.count > 1 ? parts[1] : ""
        }
        func refuse(_ error: String, _ description: String) -> HTTPServerResponse {
            state.withLock { $0.counters.grantsRefused += 1 }
            return Self.json(400, ["error": .string(error), "error_description": .string(description)])
        }
        guard fields["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer" else {
            return refuse("unsupported_grant_type", "Invalid grant_type: \(fields["grant_type"] ?? "")")
        }
        guard let assertion = fields["assertion"] else { return refuse("invalid_request", "Missing required parameter: assertion") }
        let keyID: String
        switch check(assertion) {
        case .failure(let problem): return refuse("invalid_grant", problem.description)
        case .success(let id): keyID = id
        }
        let token = "ya29.sim-" + UUID().uuidString.lowercased()
        let lifetime = settings.tokenLifetime
        state.withLock { state in
            state.tokens[token] = Date().addingTimeInterval(lifetime.seconds)
            state.counters.tokensIssued += 1
            state.grantKeyIDs.append(keyID)
        }
        return Self.json(200, ["access_token": .string(token), "expires_in": .number(JSONNumber(Int(lifetime.seconds))),
                               "token_type": "Bearer"])
    }

    /// The id of the key that signed the assertion, or why Google would refuse it.
    private func check(_ assertion: String) -> Result<String, SimulatorError> {
        func refuse(_ reason: String) -> Result<String, SimulatorError> { .failure(SimulatorError(reason)) }
        let parts = assertion.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 3, let headerBytes = Base64URL.decode(parts[0]), let claimBytes = Base64URL.decode(parts[1]),
              let signature = Base64URL.decode(parts[2]),
              let header = try? JSONValue.parse(String(decoding: headerBytes, as: UTF8.self)),
              let claims = try? JSONValue.parse(String(decoding: claimBytes, as: UTF8.self)) else {
            return refuse("Invalid JWT: the assertion is not a signed JWT")
        }
        guard header["alg"]?.stringValue == "RS256" else { return refuse("Invalid JWT: the algorithm must be RS256") }
        let keys = state.withLock { state in state.keys.filter { !state.revokedKeys.contains($0.key) } }
        let signingInput = Array((parts[0] + "." + parts[1]).utf8)
        let candidates = header["kid"]?.stringValue.map { kid in keys.filter { $0.key == kid } } ?? keys
        guard let keyID = candidates.first(where: { $0.value.verifySHA256(signingInput, signature: signature) })?.key else {
            return refuse("Invalid JWT Signature.")
        }
        guard claims["iss"]?.stringValue == account.clientEmail else { return refuse("Invalid JWT: iss is not the service account") }
        let scopes = (claims["scope"]?.stringValue ?? "").split(separator: " ").map(String.init)
        guard scopes.contains(ServiceAccount.messagingScope) || scopes.contains("https://www.googleapis.com/auth/cloud-platform") else {
            return refuse("Invalid JWT: no scope allows sending messages (firebase.messaging or cloud-platform)")
        }
        guard let audience = claims["aud"]?.stringValue, audience == ServiceAccount.googleTokenAudience || audience == tokenURI else {
            return refuse("Invalid JWT: audience is not the token endpoint")
        }
        guard case .number(let issuedNumber)? = claims["iat"], let issued = issuedNumber.int64Value,
              case .number(let expiresNumber)? = claims["exp"], let expires = expiresNumber.int64Value else {
            return refuse("Invalid JWT: iat and exp are required")
        }
        let now = Int64(Date().timeIntervalSince1970)
        guard issued <= now + 60 else { return refuse("Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim.") }
        guard expires > now, expires - issued <= 3600 else {
            return refuse("Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim.")
        }
        return .success(keyID)
    }

    // MARK: - Sending

    /// The answer to a send request, and its target (for the log). `tokenExpiry`: when the
    /// request's bearer token expires (nil: it is not one this endpoint issued).
    private func send(_ request: HTTPServerRequest, project: String, tokenExpiry: Date?) -> (HTTPServerResponse, String) {
        let now = Date()
        guard let expiry = tokenExpiry, expiry > now else {
            return (Self.googleError(401, "UNAUTHENTICATED",
                                     "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential."), "")
        }
        guard project == account.projectID else {
            return (Self.googleError(403, "PERMISSION_DENIED", "Permission 'cloudmessaging.messages.create' denied on resource '//cloudresourcemanager.googleapis.com/projects/\(project)' (or it may not exist)."), "")
        }
        guard case .object(let body)? = try? JSONValue.parse(request.bodyText) else {
            return (Self.googleError(400, "INVALID_ARGUMENT", "Invalid JSON payload received."), "")
        }
        for key in body.keys where key != "message" && key != "validate_only" {
            return (Self.badRequest("Invalid JSON payload received. Unknown name \"\(key)\": Cannot find field.", field: key), "")
        }
        guard case .object(let message)? = body["message"] else {
            return (Self.badRequest("Request contains an invalid argument.", field: "message"), "")
        }
        if let problem = Self.problem(with: message) { return (Self.badRequest(problem.description, field: problem.field), "") }
        let validateOnly = body["validate_only"] == .bool(true)
        let target = message["token"]?.stringValue ?? message["fid"]?.stringValue
            ?? message["topic"].flatMap(\.stringValue).map { "/topics/\($0)" } ?? message["condition"]?.stringValue ?? ""
        if let quota = settings.quotaPerMinute {
            let window = settings.quotaWindow.seconds
            let waited = state.withLock { state -> Int? in
                if now.timeIntervalSince(state.quotaWindow.start) >= window { state.quotaWindow = (now, 0) }
                guard state.quotaWindow.count < quota else {
                    state.counters.quotaRefusals += 1
                    return max(1, Int((window - now.timeIntervalSince(state.quotaWindow.start)).rounded(.up)))
                }
                state.quotaWindow.count += 1
                return nil
            }
            if let waited { return (quotaRefusal(.project, subject: "project_number:\(projectNumber)", retryAfter: waited), target) }
        }
        if let quota = settings.deviceQuota, let token = message["token"]?.stringValue {
            let window = settings.quotaWindow.seconds
            let waited = state.withLock { state -> Int? in
                var entry = state.deviceWindows[token] ?? (now, 0)
                if now.timeIntervalSince(entry.start) >= window { entry = (now, 0) }
                defer { state.deviceWindows[token] = entry }
                guard entry.count < quota else {
                    state.counters.quotaRefusals += 1
                    return max(1, Int((window - now.timeIntervalSince(entry.start)).rounded(.up)))
                }
                entry.count += 1
                return nil
            }
            if let waited { return (quotaRefusal(.device, subject: "device:\(token)", retryAfter: waited), target) }
        }
        if message["token"] != nil || message["fid"] != nil {
            switch settings.targetAnswer(target) {
            case .success: break
            case .unregistered: return (Self.fcmError(404, "NOT_FOUND", "UNREGISTERED", "Requested entity was not found."), target)
            case .senderMismatch: return (Self.fcmError(403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH", "SenderId mismatch"), target)
            case .invalidToken:
                return (Self.badRequest("The registration token is not a valid FCM registration token", field: "message.token",
                                        errorCode: "INVALID_ARGUMENT"), target)
            case .thirdPartyAuthError:
                return (Self.fcmError(401, "UNAUTHENTICATED", "THIRD_PARTY_AUTH_ERROR", "Auth error from APNS or Web Push Service"), target)
            case .apnsAuthError:
                return (Self.fcmError(401, "UNAUTHENTICATED", "APNS_AUTH_ERROR", "Auth error from APNS or Web Push Service"), target)
            case .quotaExceeded:
                state.withLock { $0.counters.quotaRefusals += 1 }
                return (quotaRefusal(.device, subject: "device:\(target)", retryAfter: 1, alwaysRetryAfter: true), target)
            case .projectQuotaExceeded:
                state.withLock { $0.counters.quotaRefusals += 1 }
                return (quotaRefusal(.project, subject: "project_number:\(projectNumber)", retryAfter: nil), target)
            }
        }
        var delivered: Delivery?
        let name = state.withLock { state -> String in
            guard !validateOnly else { return "projects/\(project)/messages/fake_message_id" }
            state.nextMessageID += 1
            // As FCM writes them: 0:MICROSECONDS%SENDERHASH.
            let name = "projects/\(project)/messages/0:\(Int64(now.timeIntervalSince1970 * 1_000_000) + state.nextMessageID)%\(senderHash)"
            if settings.recordsDeliveries || settings.onDelivery != nil {
                let delivery = Delivery(name: name, message: .object(message), validateOnly: false, protocolName: request.protocolName,
                                        headers: request.headers.filter { $0.key != "authorization" })
                if settings.recordsDeliveries { state.deliveries.append(delivery) }
                delivered = delivery
            }
            state.counters.delivered += 1
            return name
        }
        if let delivered { settings.onDelivery?(delivered) }
        return (Self.success(name: name), target)
    }

    /// What FCM refuses in a message with `INVALID_ARGUMENT`, with the field.
    static func problem(with message: [String: JSONValue]) -> (field: String, description: String)? {
        // The first in key order is named; sorted only when there is one.
        if message.keys.contains(where: { !FCMV1Message.messageMembers.contains($0) }) {
            let key = message.keys.sorted().first { !FCMV1Message.messageMembers.contains($0) }!
            return ("message", "Invalid JSON payload received. Unknown name \"\(key)\" at 'message': Cannot find field.")
        }
        let targets = FCMV1Message.targetMembers.filter { message[$0] != nil }
        guard targets.count == 1 else { return ("message", "Exactly one of token, topic, condition or fid must be specified.") }
        guard let value = message[targets[0]]?.stringValue, !value.isEmpty else {
            return ("message.\(targets[0])", "Invalid value at 'message.\(targets[0])' (TYPE_STRING)")
        }
        /// A data entry FCM refuses: a value that is not a string, or a reserved key.
        func refused(_ key: String, _ item: JSONValue) -> Bool {
            guard case .string = item else { return true }
            let lower = key.lowercased()
            return lower == "from" || lower.hasPrefix("google") || lower.hasPrefix("gcm") || lower == "message_type"
        }
        if case .object(let data)? = message["data"], data.contains(where: refused) {
            // The first in key order is named, with its index.
            for (index, (key, item)) in data.sorted(by: { $0.key < $1.key }).enumerated() where refused(key, item) {
                guard case .string = item else { return ("message.data[\(index)].value", "Invalid value at 'message.data[\(index)].value' (TYPE_STRING)") }
                return ("message.data", "Invalid data payload key: \(key)")
            }
        } else if let data = message["data"], data.objectValue == nil {
            return ("message.data", "Invalid value at 'message.data' (type.googleapis.com/google.firebase.fcm.v1.Message.DataEntry)")
        }
        if let ttl = message["android"]?["ttl"], !(ttl.stringValue.map(FCMV1Message.isDuration) ?? false) {
            return ("message.android.ttl", "Invalid value at 'message.android.ttl' (type.googleapis.com/google.protobuf.Duration), Field 'ttl', Illegal duration format; duration must end with 's'")
        }
        // FCM reads enum names in either case: the Admin SDKs send "high" and "normal".
        func isPriority(_ text: String?) -> Bool {
            switch text {
            case "high"?, "normal"?, "HIGH"?, "NORMAL"?: true
            case let text?: ["NORMAL", "HIGH"].contains(text.uppercased())
            case nil: false
            }
        }
        if let priority = message["android"]?["priority"], !isPriority(priority.stringValue) {
            return ("message.android.priority", "Invalid value at 'message.android.priority' (type.googleapis.com/google.firebase.fcm.v1.AndroidMessagePriority)")
        }
        let size = message["data"]?.wireBytes.count ?? 0
        if size > 4096 + 64 { return ("message", "Message is too big") }
        if let token = message["token"]?.stringValue, isAppleToken(token), let problem = apnsPriorityProblem(message) { return problem }
        return nil
    }

    /// Apple's rule, which FCM passes on as `INVALID_ARGUMENT`: `apns-priority: 10` only for
    /// a notification that alerts the user (a title or body, an `aps` alert, sound or
    /// badge), never for a background push (data only or `content-available` without an
    /// alert, or `apns-push-type: background`).
    static func apnsPriorityProblem(_ message: [String: JSONValue]) -> (field: String, description: String)? {
        let headers = message["apns"]?["headers"]
        guard headers?["apns-priority"]?.stringValue == "10" else { return nil }
        let aps = message["apns"]?["payload"]?["aps"]
        let alerts = message["notification"]?["title"] != nil || message["notification"]?["body"] != nil
            || aps?["alert"] != nil || aps?["sound"] != nil || aps?["badge"] != nil
        guard !alerts || headers?["apns-push-type"]?.stringValue == "background" else { return nil }
        return ("message.apns.headers",
                "apns-priority 10 is not allowed for a background notification (no alert, or content-available): use 5")
    }

    // MARK: - Answers as Google writes them

    /// The project's number, as Google's quota answers name it (the simulator's project has one number).
    private var projectNumber: String { "100000000001" }

    /// A quota 429 as Google writes it: `RESOURCE_EXHAUSTED`, a `QuotaFailure` naming what
    /// was exceeded, FCM's code or an `ErrorInfo` (`quotaShape`, the project's only), and
    /// `Retry-After` unless `quotaRetryAfter` is off (a device's `quota-` token always has it).
    private func quotaRefusal(_ scope: FCMV1Error.QuotaScope, subject: String, retryAfter: Int?,
                              alwaysRetryAfter: Bool = false) -> HTTPServerResponse {
        let description = scope == .device ? "Device message rate exceeded." : "Message rate quota exceeded for the project."
        let quotaFailure: JSONValue = ["@type": "type.googleapis.com/google.rpc.QuotaFailure",
                                       "violations": [["subject": .string(subject), "description": .string(description)]]]
        var details: [JSONValue]
        if scope == .project, settings.quotaShape == .errorInfo {
            details = [["@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED", "domain": "googleapis.com",
                        "metadata": ["service": "fcm.googleapis.com", "quota_metric": "fcm.googleapis.com/fcm_message_requests",
                                     "consumer": .string("projects/\(projectNumber)")]], quotaFailure]
        } else {
            details = [["@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": "QUOTA_EXCEEDED"], quotaFailure]
        }
        var response = Self.googleError(429, "RESOURCE_EXHAUSTED",
                                        scope == .device ? "Message rate exceeded for this device." : "Quota exceeded for quota metric 'Send requests'.",
                                        details: details)
        if let retryAfter, settings.quotaRetryAfter || alwaysRetryAfter { response.headers.append(("retry-after", String(retryAfter))) }
        return response
    }

    private static func scriptedError(_ status: Int) -> HTTPServerResponse {
        switch status {
        case 429: googleError(429, "RESOURCE_EXHAUSTED", "Quota exceeded.", details: [
            ["@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": "QUOTA_EXCEEDED"],
            ["@type": "type.googleapis.com/google.rpc.QuotaFailure",
             "violations": [["subject": "project_number:1000", "description": "Message rate quota exceeded for the project."]]],
        ])
        case 500: fcmError(500, "INTERNAL", "INTERNAL", "Internal error encountered.")
        case 503: fcmError(503, "UNAVAILABLE", "UNAVAILABLE", "The service is currently unavailable.")
        case 401: googleError(401, "UNAUTHENTICATED", "Request had invalid authentication credentials.")
        default: googleError(status, "HTTP_\(status)", "scripted")
        }
    }

    static func googleError(_ code: Int, _ status: String, _ message: String, details: [JSONValue] = []) -> HTTPServerResponse {
        var error: [String: JSONValue] = ["code": .number(JSONNumber(code)), "message": .string(message), "status": .string(status)]
        if !details.isEmpty { error["details"] = .array(details) }
        return json(code, ["error": .object(error)])
    }

    static func fcmError(_ code: Int, _ status: String, _ errorCode: String, _ message: String) -> HTTPServerResponse {
        googleError(code, status, message, details: [
            ["@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": .string(errorCode)],
        ])
    }

    static func badRequest(_ message: String, field: String, errorCode: String = "INVALID_ARGUMENT") -> HTTPServerResponse {
        googleError(400, "INVALID_ARGUMENT", message, details: [
            ["@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": .string(errorCode)],
            ["@type": "type.googleapis.com/google.rpc.BadRequest",
             "fieldViolations": [["field": .string(field), "description": .string(message)]]],
        ])
    }

    /// A success as FCM writes it: pretty-printed, as Google's APIs answer.
    static func success(name: String) -> HTTPServerResponse {
        var body = Array("{\n  \"name\": ".utf8)
        JSONValue.appendQuoted(name, to: &body)
        body.append(contentsOf: "\n}\n".utf8)
        return HTTPServerResponse(status: 200, headers: [("content-type", "application/json; charset=UTF-8")], body: body)
    }

    static func json(_ status: Int, _ members: [String: JSONValue]) -> HTTPServerResponse {
        HTTPServerResponse(status: status, headers: [("content-type", "application/json; charset=UTF-8")],
                           body: Array(JSONValue.object(members).serialized.utf8))
    }
}
