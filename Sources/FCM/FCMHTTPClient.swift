import Foundation
import Runtime
import Transport
import XMPP

/// FCM's legacy HTTP protocol (docs/protocol.md section 8): sends, multicasts split into
/// batches of 1,000 tokens, and device-group operations, over kept-alive HTTPS connections
/// with a bounded number of requests in flight.
///
/// Messages are validated before anything is sent. A 401 stops at once (a configuration
/// error: it is never retried in a loop); a 400 is returned as it is; a 5xx or a failed
/// connection is retried (unless the caller retries itself: `retrying: false`) after
/// `Retry-After` when FCM gives one (at most `maximumRetryAfter`), otherwise with
/// exponential backoff and jitter, up to `maximumAttempts`. A request whose connection
/// broke after it was fully written is never sent again here: FCM may have taken it.
/// Cancelling the calling task ends a wait at once with `.transport(.cancelled)`.
public final class FCMHTTPClient: Sendable {
    /// Where and how to reach FCM.
    public struct Settings: Sendable {
        /// `https://fcm.googleapis.com` in production; the simulator's address in tests.
        public var host = "fcm.googleapis.com"
        public var port = 443
        public var trust: TLSTrust = .systemDefault
        public var serverKey: String
        /// The sender ID, sent as `project_id` for device groups.
        public var senderID: String
        public var maximumInFlight = 4
        public var requestTimeout: Duration = .seconds(30)
        public var maximumAttempts = 5
        /// The first backoff wait (doubled per attempt, × [0.5, 1.5), capped at 60 s).
        public var retryBase: Duration = .seconds(1)
        /// The longest `Retry-After` waited for.
        public var maximumRetryAfter: Duration = .seconds(300)

        public init(serverKey: String, senderID: String) {
            self.serverKey = serverKey
            self.senderID = senderID
        }

        /// `host:port`, `[v6]:port` or a bare host (port 443), as in `--http-endpoint`.
        public mutating func setEndpoint(_ text: String) throws(DownstreamValidationError) {
            var host = text, port = 443
            if text.hasPrefix("https://") { host = String(text.dropFirst("https://".count)) }
            if let slash = host.firstIndex(of: "/") { host = String(host[..<slash]) }
            if host.hasPrefix("["), let close = host.firstIndex(of: "]") {
                let rest = host[host.index(after: close)...]
                if rest.hasPrefix(":") { port = Int(rest.dropFirst()) ?? -1 }
                host = String(host[host.index(after: host.startIndex)..<close])
            } else if let colon = host.lastIndex(of: ":") {
                port = Int(host[host.index(after: colon)...]) ?? -1
                host = String(host[..<colon])
            }
            guard !host.isEmpty, (1...65535).contains(port) else { throw .init("http-endpoint", "\(text) is not host:port") }
            self.host = host
            self.port = port
        }
    }

    /// Why a request did not succeed.
    public enum Failure: Error, Sendable, Equatable, CustomStringConvertible {
        /// Refused before sending: the message breaks a rule of FCM.
        case invalid(DownstreamValidationError)
        /// FCM answered 400 or 401, or retries ran out on 5xx answers.
        case refused(LegacyHTTPResponse.Failure)
        /// The connection failed on every attempt.
        case transport(TransportError)

        public var description: String {
            switch self {
            case .invalid(let error): "\(error)"
            case .refused(let failure): "\(failure)"
            case .transport(let error): "could not reach FCM: \(error)"
            }
        }

        /// True for a refused server key: stop sending until the configuration is fixed.
        public var isConfigurationError: Bool { self == .refused(.unauthorized) }
    }

    /// A device-group operation (`POST /fcm/notification`).
    public enum DeviceGroupOperation: Sendable, Equatable {
        case create(name: String, tokens: [String])
        case add(name: String, key: String, tokens: [String])
        case remove(name: String, key: String, tokens: [String])
    }

    public let settings: Settings
    private let client: HTTPSClient

    /// Requests whose connection broke after they were sent and before the answer: FCM
    /// may have taken them. They are not sent again here (the caller's retry decides).
    public var outcomeUnknownCount: Int { client.outcomeUnknownCount }

    public init(settings: Settings) throws(TransportError) {
        self.settings = settings
        self.client = try HTTPSClient(host: settings.host, port: settings.port, trust: settings.trust,
                                      maximumConnections: settings.maximumInFlight, timeout: settings.requestTimeout)
    }

    /// Sends one message (JSON, or the plain-text form with `plainText`); with `retrying`
    /// false a 5xx or failed connection is returned at once.
    public func send(_ message: LegacyHTTPMessage, plainText: Bool = false, retrying: Bool = true) async throws(Failure) -> LegacyHTTPResponse {
        do {
            try message.validate()
        } catch {
            throw .invalid(error)
        }
        let body: String
        var tokens: Int?
        if plainText {
            do { body = try message.formBody() } catch { throw .invalid(error) }
            tokens = 1
        } else {
            body = message.jsonBody
            switch message.target {
            case .registrationIDs(let list): tokens = list.count
            case .to(let to) where !to.hasPrefix("/topics/"): tokens = 1
            case .notificationKey: tokens = 1
            default: tokens = nil
            }
        }
        let contentType = plainText ? "application/x-www-form-urlencoded;charset=UTF-8" : "application/json"
        let response = try await post("/fcm/send", contentType: contentType, body: body, extraHeaders: [:], retrying: retrying)
        do {
            return try LegacyHTTPResponse.parse(status: response.status, retryAfter: nil, body: response.body,
                                                plainText: plainText, tokens: tokens)
        } catch {
            throw .refused(error)
        }
    }

    /// What a multicast of any number of tokens came to.
    public struct MulticastOutcome: Sendable {
        /// The result of each token FCM answered, in request order.
        public var results: [(token: String, result: LegacyHTTPResponse.Result)] = []
        /// Tokens of the requests that got no usable answer (not sent, or not known to be).
        public var unsent: [String] = []
        /// Why those requests failed (the first failure), nil when every request was answered.
        public var failure: Failure?
    }

    /// Sends `message` to every token of `tokens` (any number), 1,000 per request. The
    /// answered requests' results are kept when a later request fails: only the tokens of
    /// the failed ones are in `unsent`, so that a caller resends nothing twice.
    public func sendMulticast(_ message: LegacyHTTPMessage, to tokens: [String], retrying: Bool = true) async -> MulticastOutcome {
        var outcome = MulticastOutcome()
        outcome.results.reserveCapacity(tokens.count)
        var start = 0
        while start < tokens.count {
            let batch = Array(tokens[start..<min(start + LegacyHTTPMessage.maximumRegistrationIDs, tokens.count)])
            start += batch.count
            var request = message
            request.target = .registrationIDs(batch)
            do throws(Failure) {
                guard case .tokens(_, _, _, _, let batchResults) = try await send(request, retrying: retrying) else {
                    throw Failure.refused(.unexpected(status: 200, detail: "a multicast was answered like a topic message"))
                }
                outcome.results += zip(batch, batchResults).map { ($0, $1) }
            } catch {
                outcome.unsent += batch
                if outcome.failure == nil { outcome.failure = error }
                // A refused key or cancellation ends the multicast; a batch FCM could not
                // take does not stop the others.
                if error.isConfigurationError || error == .transport(.cancelled) {
                    outcome.unsent += tokens[start...]
                    break
                }
            }
        }
        return outcome
    }

    /// Runs a device-group operation and returns the group's notification key.
    public func deviceGroup(_ operation: DeviceGroupOperation) async throws(Failure) -> String {
        var members: [String: JSONValue] = [:]
        let tokens: [String]
        switch operation {
        case .create(let name, let list):
            members = ["operation": .string("create"), "notification_key_name": .string(name)]
            tokens = list
        case .add(let name, let key, let list), .remove(let name, let key, let list):
            members = ["operation": .string(operation.isAdd ? "add" : "remove"), "notification_key_name": .string(name),
                       "notification_key": .string(key)]
            tokens = list
        }
        guard !tokens.isEmpty, tokens.count <= LegacyHTTPMessage.maximumRegistrationIDs else {
            throw .invalid(.init("registration_ids", "a device-group operation takes 1 to 1000 tokens"))
        }
        members["registration_ids"] = .array(tokens.map(JSONValue.string))
        let response = try await post("/fcm/notification", contentType: "application/json", body: JSONValue.object(members).serialized,
                                      extraHeaders: ["project_id": settings.senderID], retrying: true)
        let parsed = try? JSONValue.parse(response.body)
        switch response.status {
        case 200:
            guard let key = parsed?["notification_key"]?.stringValue else {
                throw .refused(.unexpected(status: 200, detail: "no notification_key in \(response.body.prefix(120))"))
            }
            return key
        case 401: throw .refused(.unauthorized)
        default: throw .refused(.badRequest(parsed?["error"]?.stringValue ?? response.body.prefix(200).description))
        }
    }

    /// POSTs with the server key, retrying 5xx answers and failed connections when
    /// `retrying` (never a request that may have reached FCM: see `HTTPSClient`).
    private func post(_ path: String, contentType: String, body: String,
                      extraHeaders: [String: String], retrying: Bool) async throws(Failure) -> HTTPSClient.Response {
        var headers = extraHeaders
        headers["authorization"] = "key=\(settings.serverKey)"
        headers["content-type"] = contentType
        var backoff = Backoff(base: settings.retryBase, cap: .seconds(60), jitter: .scaled(0.5..<1.5))
        var attempt = 0
        while true {
            attempt += 1
            let wait: Duration
            do {
                let response = try await client.send(method: "POST", path: path, headers: headers, body: Array(body.utf8))
                guard (500...599).contains(response.status) else { return response }
                let retryAfter = response.headers["retry-after"].flatMap { LegacyHTTPResponse.parseRetryAfter($0) }
                guard retrying, attempt < settings.maximumAttempts else {
                    throw Failure.refused(.unavailable(status: response.status, retryAfter: retryAfter))
                }
                wait = min(retryAfter ?? backoff.next(), settings.maximumRetryAfter)
            } catch let failure as Failure {
                throw failure
            } catch {
                let transport = (error as? TransportError) ?? .connectionLost("\(error)")
                guard retrying, attempt < settings.maximumAttempts, transport != .cancelled,
                      !transport.isOutcomeUnknown else { throw .transport(transport) }
                wait = backoff.next()
            }
            guard await sleepUnlessCancelled(for: wait) else { throw .transport(.cancelled) }
        }
    }
}

extension FCMHTTPClient.DeviceGroupOperation {
    var isAdd: Bool { if case .add = self { true } else { false } }
}
