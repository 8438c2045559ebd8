import Foundation
import Runtime
import Synchronization
import Transport

/// One published key set kept fresh: fetched over HTTPS, cached for the `max-age` of its
/// `Cache-Control`, refreshed before it expires (at 90 % of its age, at least a minute
/// before), and kept through a failed refresh (retried with backoff from 5 s to 5 min) so
/// that Google's endpoint being slow or down does not refuse every device. A token naming a
/// key the set lacks asks for an early refresh (Google rotates keys), at most every 30 s.
public final class FirebaseKeySource: Sendable {
    private struct State {
        var keys: FirebaseKeySet?
        var fetchedAt: Date?
        var expiresAt: Date?
        var lastEarlyRefresh: ContinuousClock.Instant?
        var failures = 0
    }

    public let url: String
    private let host: String
    private let port: Int
    private let path: String
    private let client: HTTPSClient
    private let logger: Logger
    private let state = BlockingLock(State())
    private let wake = Doorbell()

    /// - Throws: `TransportError` for a URL that is not `https://host[:port]/path`.
    public init(url: String, trust: TLSTrust, logger: Logger) throws(TransportError) {
        guard let components = URLComponents(string: url), components.scheme == "https", let host = components.host, !host.isEmpty else {
            throw .connectFailed(host: url, port: 0, reason: "a key URL must be https://host[:port]/path")
        }
        self.url = url
        self.host = host
        self.port = components.port ?? 443
        self.path = components.percentEncodedPath.isEmpty ? "/" : components.percentEncodedPath
            + (components.percentEncodedQuery.map { "?" + $0 } ?? "")
        self.client = try HTTPSClient(host: host, port: port, trust: trust, maximumConnections: 1, timeout: .seconds(10))
        self.logger = logger
    }

    /// The keys as last fetched (nil until a fetch succeeded).
    public var keys: FirebaseKeySet? { state.withLock { $0.keys } }

    /// Seconds since the keys were fetched (nil before), for `fcm_worker_ingress_key_set_age_seconds`.
    public var age: Double? { state.withLock { $0.fetchedAt.map { Date().timeIntervalSince($0) } } }

    /// A token named a key the set lacks: refresh soon, unless that was asked within 30 s.
    public func refreshEarly() {
        let ring = state.withLock { state -> Bool in
            if let last = state.lastEarlyRefresh, ContinuousClock.now - last < .seconds(30) { return false }
            state.lastEarlyRefresh = .now
            return true
        }
        if ring { wake.ring() }
    }

    /// Fetches once. Returns true when the set was replaced.
    /// - Throws: the transport's or the document's error (the old set is kept).
    @discardableResult
    public func fetch() async throws -> Bool {
        let response = try await client.send(method: "GET", path: path, headers: ["accept": "application/json"], body: [])
        guard response.status == 200 else {
            throw FirebaseKeySet.Unreadable("\(url) answered \(response.status)")
        }
        let keys = try FirebaseKeySet(json: response.body)
        let maxAge = Self.maxAge(response.headers["cache-control"]) ?? 3600
        let now = Date()
        state.withLock { state in
            state.keys = keys
            state.fetchedAt = now
            state.expiresAt = now.addingTimeInterval(Double(maxAge))
            state.failures = 0
        }
        return true
    }

    /// Fetches the set, then keeps it fresh until `stop`; `firstAttempt` runs once the first
    /// fetch succeeded or failed. While no set was ever fetched, a failed fetch is retried
    /// soon (1 s, doubling to 10 s: every token is refused until one succeeds); a failed
    /// refresh of a set held is retried on the longer backoff (5 s to 5 min).
    package func run(until stop: ShutdownSignal, firstAttempt: @Sendable () -> Void = {}) async {
        stop.onRequest { [wake] in wake.ring() }
        var attempted = false
        defer { if !attempted { firstAttempt() } }
        while !stop.isRequested && !Task.isCancelled {
            let delay: Duration
            do {
                try await fetch()
                let (expiresAt, count) = state.withLock { ($0.expiresAt ?? Date(), $0.keys?.keys.count ?? 0) }
                let life = expiresAt.timeIntervalSinceNow
                delay = .seconds(max(30, min(life * 0.9, life - 60)))
                logger.debug("fetched \(count) key(s) from \(url); next refresh in \(delay.formattedSeconds)")
            } catch {
                let failures = state.withLock { state -> Int in
                    state.failures += 1
                    return state.failures
                }
                let held = keys != nil
                delay = held ? .seconds(min(300, 5 * Double(1 << min(failures - 1, 6)))) : .seconds(min(10, Double(1 << min(failures - 1, 4))))
                let kept = held ? "the keys fetched before are kept" : "no keys yet: tokens are refused (503) until a fetch succeeds"
                logger.warning("could not fetch the signing keys from \(url) (\(error)); \(kept); retrying in \(delay.formattedSeconds)")
            }
            if !attempted {
                attempted = true
                firstAttempt()
            }
            await wake.wait(timeout: delay)
        }
    }

    /// `max-age` of a `Cache-Control` value.
    static func maxAge(_ header: String?) -> Int? {
        guard let header else { return nil }
        for directive in header.split(separator: ",") {
            let parts = directive.trimmingCharacters(in: .whitespaces).split(separator: "=", maxSplits: 1)
            if parts.count == 2, parts[0].lowercased() == "max-age", let seconds = Int(parts[1]), seconds >= 0 { return seconds }
        }
        return nil
    }
}
