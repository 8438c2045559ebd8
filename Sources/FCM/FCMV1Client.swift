import Foundation
import Runtime
import Transport

/// FCM's HTTP v1 send API for one service account: `POST /v1/projects/{project}/messages:send`
/// over HTTP/2 (many concurrent streams on a few connections, HTTP/1.1 when the server
/// refuses h2), authorized by the account's OAuth2 access token.
///
/// `send` returns FCM's answer as it is, but for one case it handles itself: an access token
/// FCM refused (401 `UNAUTHENTICATED`) is replaced and the message sent once more (FCM did
/// not process it). It never sends a message again after FCM may have processed it: a
/// broken stream or connection after the request went out is `.transport(.outcomeUnknown)`.
public final class FCMV1Client: Sendable {
    /// Where and how to reach FCM.
    public struct Settings: Sendable {
        /// `fcm.googleapis.com:443` in production; the simulator's address in tests.
        public var host = "fcm.googleapis.com"
        public var port = 443
        public var trust: TLSTrust = .systemDefault
        /// The project messages are sent for (the service account's by default).
        public var projectID: String?
        public var maximumConnections = 2
        public var maximumStreamsPerConnection = 100
        public var requestTimeout: Duration = .seconds(30)
        /// What the client calls itself in `User-Agent` and `X-Firebase-Client`
        /// (`fcm-worker/VERSION`), as Google's Admin SDKs name themselves there.
        public var clientName = "fcm-worker"

        public init() {}
    }

    /// Why a send got no answer from FCM.
    public enum Failure: Error, Sendable, Equatable, CustomStringConvertible {
        /// No access token (the grant was refused, or the token endpoint is unreachable).
        case credentials(AccessTokenSource.Failure)
        /// The request could not be made or its answer read (`.outcomeUnknown`: it may
        /// have been processed).
        case transport(TransportError)

        public var description: String {
            switch self {
            case .credentials(let failure): "\(failure)"
            case .transport(let error): "\(error)"
            }
        }
    }

    /// The project messages are sent for: `Settings.projectID`, else the project of the
    /// account the current access token was granted to (it follows a replaced key file).
    public var projectID: String { fixedProjectID ?? tokens.account.projectID }
    private let fixedProjectID: String?
    public let tokens: AccessTokenSource
    private let client: HTTP2Client
    private let clientName: String
    private let requestHeaders = BlockingLock<(token: String, path: String, headers: [(name: String, value: String)])?>(nil)

    /// A client for `account`.
    /// - Throws: `Failure` when the TLS settings are unusable.
    public convenience init(account: ServiceAccount, settings: Settings) throws(Failure) {
        try self.init(tokens: AccessTokenSource(account: account, trust: settings.trust), projectID: settings.projectID, settings: settings)
    }

    /// A client for the account of a key file, read again when it changes.
    /// - Throws: `Failure` when the TLS settings are unusable.
    public convenience init(file: ServiceAccountFile, settings: Settings) throws(Failure) {
        try self.init(tokens: AccessTokenSource(file: file, trust: settings.trust), projectID: settings.projectID, settings: settings)
    }

    private init(tokens: AccessTokenSource, projectID: String?, settings: Settings) throws(Failure) {
        self.fixedProjectID = projectID
        self.tokens = tokens
        do {
            client = try HTTP2Client(host: settings.host, port: settings.port, trust: settings.trust,
                                     maximumConnections: settings.maximumConnections,
                                     maximumStreamsPerConnection: settings.maximumStreamsPerConnection,
                                     timeout: settings.requestTimeout)
        } catch {
            throw .transport(error)
        }
        clientName = settings.clientName
    }

    /// Requests sent whose outcome is unknown (a stream or connection broke after sending).
    public var outcomeUnknownCount: Int { client.outcomeUnknownCount }

    /// True when FCM's server chose HTTP/1.1 over h2.
    public var fellBackToHTTP1: Bool { client.fellBackToHTTP1 }

    /// The concurrent requests it can have in flight.
    public var capacity: Int { client.maximumConnections * client.maximumStreamsPerConnection }
    /// The HTTP/2 connections it may open.
    public var connections: Int { client.maximumConnections }

    /// Fetches an access token now: a refused grant shows at start, not at the first message.
    public func checkCredentials() async throws(Failure) {
        do {
            _ = try await tokens.token()
        } catch let failure as AccessTokenSource.Failure {
            throw .credentials(failure)
        } catch {
            throw .transport(.cancelled)
        }
    }

    /// Sends one message with `token` without waiting: `complete` runs once with FCM's
    /// answer or the failure, on a connection's thread (it must not block). An access token
    /// FCM refuses comes back as the answer (`UNAUTHENTICATED`): the caller fetches another
    /// (`tokens.invalidate`, `tokens.token()`) and submits again.
    /// `body` is a request body as `FCMV1Message.wireBody` writes it.
    public func submit(body: [UInt8], token: String, complete: @escaping @Sendable (Result<FCMV1Answer, Failure>) -> Void) {
        let (path, headers) = request(token: token)
        client.submit(method: "POST", path: path, headers: headers, body: body) { result in
            switch result {
            case .success(let response): complete(.success(FCMV1Answer(status: response.status, headers: response.headers, body: response.body)))
            case .failure(let error): complete(.failure(.transport(error)))
            }
        }
    }

    /// A request's headers with `token`: built once per access token, not per request.
    /// Beside the token and the type, what Google's Admin SDKs send: the API format version
    /// 2 (errors with `details`) and the client's name.
    private func request(token: String) -> (path: String, headers: [(name: String, value: String)]) {
        requestHeaders.withLock { cached in
            if let cached, cached.token == token { return (cached.path, cached.headers) }
            let path = "/v1/projects/\(projectID)/messages:send"
            let headers = [("authorization", "Bearer \(token)"), ("content-type", "application/json; charset=UTF-8"),
                           ("x-goog-api-format-version", "2"), ("x-firebase-client", clientName), ("user-agent", clientName)]
            cached = (token, path, headers)
            return (path, headers)
        }
    }

    /// Ends every request not sent yet with `.transport(.cancelled)`; those under way go on.
    public func cancelUnsent() {
        client.cancelUnsent()
    }

    /// Ends every request under way with `.transport(.cancelled)`.
    public func cancelAll() {
        client.cancelAll()
    }

    /// Sends one message and returns FCM's answer.
    /// - Throws: `Failure` when there was no answer.
    public func send(_ message: FCMV1Message) async throws(Failure) -> FCMV1Answer {
        let body = message.wireBody
        var refreshed = false
        while true {
            let token: String
            do {
                token = try await tokens.token()
            } catch let failure as AccessTokenSource.Failure {
                throw .credentials(failure)
            } catch {
                throw .transport(.cancelled)
            }
            let response: HTTPSClient.Response
            do {
                let (path, headers) = request(token: token)
                response = try await client.send(method: "POST", path: path, headers: headers, body: body)
            } catch let error as TransportError {
                throw .transport(error)
            } catch {
                throw .transport(.cancelled)
            }
            let answer = FCMV1Answer(status: response.status, headers: response.headers, body: response.body)
            if case .refused(let error) = answer, error.action == .refreshToken, !refreshed {
                tokens.invalidate(token)
                refreshed = true
                continue
            }
            return answer
        }
    }
}
