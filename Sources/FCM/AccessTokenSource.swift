import Foundation
import Runtime
import Transport

/// OAuth2 access tokens for a service account (the JWT-bearer grant at its `token_uri`),
/// shared by every request: one token at a time, fetched by one caller while the others
/// wait for it, refreshed once less than `refreshAhead` of it is left (callers go on with
/// the current one meanwhile), and at once after FCM refused it (`invalidate`).
///
/// The token endpoint is treated as google-auth treats it: a 408, a 429, a 5xx, a 400 whose
/// `error` is `internal_failure`, `server_error` or `temporarily_unavailable`, and a
/// connection that fails are transient, tried again within one fetch (`retryDelays`, with
/// jitter) and then reported as `unreachable`; only the other refusals (`invalid_grant`,
/// `invalid_client`, `unauthorized_client`, a key that cannot sign) are `refused`.
///
/// Neither the key nor a token is ever logged or part of an error's description.
public final class AccessTokenSource: Sendable {
    /// Why no token could be had.
    public enum Failure: Error, Sendable, Equatable, CustomStringConvertible {
        /// The token endpoint refused the grant (a revoked or unknown key, a wrong clock, a
        /// malformed assertion): a configuration error, not retried in a loop.
        case refused(String)
        /// The token endpoint could not be reached or failed (5xx): try again later.
        case unreachable(String)

        public var description: String {
            switch self {
            case .refused(let reason): "the token endpoint refused the service account's grant: \(reason)"
            case .unreachable(let reason): "cannot get an access token: \(reason)"
            }
        }
    }

    private struct Token {
        let value: String
        let expiresAt: ContinuousClock.Instant
    }

    private struct State {
        var current: Token?
        /// A fetch under way: the callers with no usable token wait for it.
        var fetching: OneShot<Token>?
        var fetched = 0
    }

    /// How long before expiry a token is replaced.
    public let refreshAhead: Duration
    /// The waits before the second and later tries of one fetch after a transient failure
    /// (google-auth tries three times); each is stretched by up to a quarter at random.
    public let retryDelays: [Duration]
    /// The `error` values of a 400 that google-auth retries.
    public static let transientErrors: Set<String> = ["internal_failure", "server_error", "temporarily_unavailable"]
    private let file: ServiceAccountFile?
    private let fixed: ServiceAccount?
    private let trust: TLSTrust
    /// The token endpoint's client, for the `token_uri` it was made for.
    private let endpoint = BlockingLock<(uri: String, client: HTTPSClient, path: String)?>(nil)
    private let state = BlockingLock(State())

    /// Tokens for `account`.
    /// - Parameter trust: how the token endpoint's certificate is verified.
    public init(account: ServiceAccount, trust: TLSTrust, refreshAhead: Duration = .seconds(300),
                retryDelays: [Duration] = [.seconds(1), .seconds(2)]) {
        self.fixed = account
        self.file = nil
        self.trust = trust
        self.refreshAhead = refreshAhead
        self.retryDelays = retryDelays
    }

    /// Tokens for the account `file` holds when each is fetched (a key rotated by
    /// replacing the file is used from the next token on).
    public init(file: ServiceAccountFile, trust: TLSTrust, refreshAhead: Duration = .seconds(300),
                retryDelays: [Duration] = [.seconds(1), .seconds(2)]) {
        self.fixed = nil
        self.file = file
        self.trust = trust
        self.refreshAhead = refreshAhead
        self.retryDelays = retryDelays
    }

    /// The account last used.
    public var account: ServiceAccount { fixed ?? file!.lastRead }

    /// Tokens fetched so far.
    public var fetchCount: Int { state.withLock { $0.fetched } }

    /// A valid access token.
    /// - Throws: `Failure`, or `CancellationError`.
    public func token() async throws -> String {
        let now = ContinuousClock.now
        enum Next { case use(String), fetch(OneShot<Token>), wait(OneShot<Token>) }
        let next = state.withLock { state -> Next in
            if let current = state.current, current.expiresAt > now {
                if current.expiresAt - now > refreshAhead || state.fetching != nil { return .use(current.value) }
            }
            if let fetching = state.fetching { return .wait(fetching) }
            let fetching = OneShot<Token>()
            state.fetching = fetching
            return .fetch(fetching)
        }
        switch next {
        case .use(let value):
            return value
        case .wait(let fetching):
            return try await fetching.value().value
        case .fetch(let fetching):
            let result: Result<Token, any Error>
            do {
                result = .success(try await fetch())
            } catch {
                result = .failure(error)
            }
            let fallback = state.withLock { state -> Token? in
                state.fetching = nil
                if case .success(let token) = result {
                    state.current = token
                    state.fetched += 1
                    return nil
                }
                // A refresh ahead of time that failed: the current token still serves.
                return state.current.flatMap { $0.expiresAt > .now ? $0 : nil }
            }
            fetching.complete(result)
            if let fallback { return fallback.value }
            return try result.get().value
        }
    }

    /// The account as its key file holds it now (read again if it changed), nil when the
    /// changed file cannot be used.
    public func currentAccount() -> ServiceAccount? {
        if let fixed { return fixed }
        return try? file!.current()
    }

    /// Drops the current token whatever it is: the next call fetches one (reading the key
    /// file again).
    public func invalidateAll() {
        state.withLock { $0.current = nil }
    }

    /// FCM refused `token` (401): the next call fetches a new one.
    public func invalidate(_ token: String) {
        state.withLock { state in
            if state.current?.value == token { state.current = nil }
        }
    }

    /// The client and path of `account`'s token endpoint.
    private func tokenEndpoint(for account: ServiceAccount) throws(Failure) -> (HTTPSClient, String) {
        if let current = endpoint.withLock({ $0 }), current.uri == account.tokenURI { return (current.client, current.path) }
        guard let url = URL(string: account.tokenURI), url.scheme == "https", let host = url.host, !host.isEmpty else {
            throw .refused("token_uri \(account.tokenURI) is not an https URL")
        }
        let path = url.path.isEmpty ? "/" : url.path + (url.query.map { "?\($0)" } ?? "")
        let client: HTTPSClient
        do {
            client = try HTTPSClient(host: host, port: url.port ?? 443, trust: trust, maximumConnections: 1, timeout: .seconds(30))
        } catch {
            throw .unreachable("\(error)")
        }
        endpoint.withLock { $0 = (account.tokenURI, client, path) }
        return (client, path)
    }

    /// One fetch: tried again after each transient failure while `retryDelays` last.
    private func fetch() async throws -> Token {
        var delays = retryDelays[...]
        while true {
            do {
                return try await fetchOnce()
            } catch Failure.unreachable(let reason) {
                guard let delay = delays.popFirst() else { throw Failure.unreachable(reason) }
                let stretch = Double.random(in: 0...0.25)
                try await Task.sleep(for: delay + delay * stretch)
            }
        }
    }

    private func fetchOnce() async throws -> Token {
        let account: ServiceAccount
        let assertion: String
        do {
            account = try fixed ?? file!.current()
            assertion = try account.assertion()
        } catch {
            throw Failure.refused("\(error)")
        }
        let (client, path) = try tokenEndpoint(for: account)
        let body = "grant_type=" + Self.formEncoded("urn:ietf:params:oauth:grant-type:jwt-bearer") + "&assertion=" + Self.formEncoded(assertion)
        let started = ContinuousClock.now
        let response: HTTPSClient.Response
        do {
            response = try await client.send(method: "POST", path: path,
                                             headers: ["content-type": "application/x-www-form-urlencoded", "accept": "application/json"],
                                             body: Array(body.utf8))
        } catch TransportError.cancelled {
            throw CancellationError()
        } catch {
            throw Failure.unreachable("\(account.tokenURI): \(error)")
        }
        let answer = try? JSONValue.parse(response.body)
        guard response.status == 200 else {
            let error = answer?["error"]?.stringValue ?? "HTTP \(response.status)"
            let detail = answer?["error_description"]?.stringValue.map { ": \($0)" } ?? ""
            if Self.isRefusal(status: response.status, error: answer?["error"]?.stringValue) {
                throw Failure.refused("\(error)\(detail)")
            }
            throw Failure.unreachable("\(account.tokenURI) answered \(response.status) (\(error)\(detail))")
        }
        guard let value = answer?["access_token"]?.stringValue, !value.isEmpty,
              case .number(let number)? = answer?["expires_in"], let seconds = number.int64Value, seconds > 0 else {
            throw Failure.unreachable("\(account.tokenURI) answered without access_token and expires_in")
        }
        return Token(value: value, expiresAt: started + .seconds(seconds))
    }

    /// True when the token endpoint's answer refuses the grant for good (google-auth's
    /// rule): a 4xx other than 408 and 429, unless its `error` is a transient one.
    public static func isRefusal(status: Int, error: String?) -> Bool {
        guard (400..<500).contains(status), status != 408, status != 429 else { return false }
        return !transientErrors.contains(error ?? "")
    }

    /// `application/x-www-form-urlencoded` escaping.
    static func formEncoded(_ text: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text
    }
}
