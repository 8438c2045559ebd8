import FCM
import Foundation
import Synchronization
import XMPP
#if canImport(Glibc)
import Glibc
#endif
import Runtime
import Transport

/// A stand-in for FCM's legacy HTTP endpoints over HTTPS on loopback (docs/protocol.md section 8):
/// `POST /fcm/send` (JSON and plain text) and `POST /fcm/notification` (device groups).
///
/// It checks `Authorization: key=…` (401 otherwise) and `project_id` for groups, validates
/// like FCM (400 with a reason for unparseable JSON, a missing target, more than 1,000
/// tokens, JSON-only features in plain text), and answers each token with `tokenAnswer`.
/// A send to a device group's notification key is answered as FCM answered one, with
/// `success`, `failure` and `failed_registration_ids`. Tests queue whole-request outcomes
/// first (`scriptNext`): a status with `Retry-After`, no answer at all (a timeout), a
/// connection closed after the request was read or after the answer, a late answer.
public final class FCMHTTPSimulator: Sendable {
    /// How one token of a send is answered.
    public enum TokenAnswer: Sendable, Equatable {
        case success(canonicalRegistrationID: String? = nil)
        case error(String)
    }

    /// A whole request's outcome, ahead of the normal answer.
    public enum Scripted: Sendable, Equatable {
        /// This status (401, 500, 503…), with `Retry-After` when given, and an empty body.
        case status(Int, retryAfter: String? = nil)
        /// Read the request and never answer (the client times out).
        case noAnswer
        /// Read the request and close the connection without an answer: whether it was
        /// processed is unknown to the client.
        case closeAfterReading
        /// Answer normally, then close the kept-alive connection (as a server does to an
        /// idle one): the client's next request must go on a new connection.
        case answerThenClose
        /// Answer normally after this delay.
        case delay(Duration)
    }

    /// A request the simulator received.
    public struct Request: Sendable {
        public let path: String
        public let headers: [String: String]
        public let body: String
        /// When the simulator read it.
        public let receivedAt: ContinuousClock.Instant

        public init(path: String, headers: [String: String], body: String, receivedAt: ContinuousClock.Instant = .now) {
            self.path = path
            self.headers = headers
            self.body = body
            self.receivedAt = receivedAt
        }
    }

    private struct State {
        var scripted: [Scripted] = []
        var requests: [Request] = []
        var groups: [String: (key: String, tokens: [String])] = [:]
        var nextMessageID: Int64 = 1
        var closedAfterAnswer = 0
        var stopped = false
    }

    public let port: Int
    public let serverKey: String
    public let senderID: String
    private let tokenAnswer: @Sendable (String) -> TokenAnswer
    private let onAnswer: (@Sendable (Request, Int) -> Void)?
    private let context: TLSContext
    private let acceptLoop: AcceptLoop
    private let state = BlockingLock(State())
    private let recordsRequests: Bool

    /// `onAnswer` is called with each request and the status it was answered with (the
    /// `simulate` command logs them). `recordsRequests`: every request is kept for `requests`
    /// (tests read them); a long-running simulator (`fcm-worker simulate`) keeps none, as
    /// they would grow without end.
    public init(senderID: String, serverKey: String, identity: TLSIdentity, host: String = "127.0.0.1",
                tokenAnswer: @escaping @Sendable (String) -> TokenAnswer = { _ in .success() },
                recordsRequests: Bool = true, onAnswer: (@Sendable (Request, Int) -> Void)? = nil) throws {
        ProcessSignals.ignoreSIGPIPE()
        self.recordsRequests = recordsRequests
        self.senderID = senderID
        self.serverKey = serverKey
        self.tokenAnswer = tokenAnswer
        self.onAnswer = onAnswer
        self.context = try TLSContext.server(identity: identity)
        acceptLoop = try AcceptLoop(host: host, port: 0)
        port = acceptLoop.port
        acceptLoop.start(name: "fcm-http-simulator accept") { [self] fd in
            Thread.start(named: "fcm-http-simulator connection") { [self] in serve(fd) }
        }
    }

    /// Stops accepting (open connections end with their current request); once it returns
    /// the port is free.
    public func stop() {
        state.withLock { $0.stopped = true }
        acceptLoop.stop()
    }

    /// Queues outcomes for the next requests, in order.
    public func scriptNext(_ outcomes: [Scripted]) {
        state.withLock { $0.scripted += outcomes }
    }

    /// Every request so far (none when it does not record them).
    public var requests: [Request] { state.withLock { $0.requests } }

    /// How many kept-alive connections were closed after an answer (`.answerThenClose`); the
    /// close is on the wire when this counts it.
    public var connectionsClosedAfterAnswer: Int { state.withLock { $0.closedAfterAnswer } }

    /// The device groups: name → (notification key, tokens).
    public var groups: [String: (key: String, tokens: [String])] { state.withLock { $0.groups } }

    // MARK: - Serving

    private func serve(_ fd: Int32) {
        guard let channel = try? TLSChannel.accept(fd: fd, context: context, deadline: .now + .seconds(10)) else { return }
        var reader = HTTPMessageReader()
        var buffer = [UInt8](repeating: 0, count: 16 << 10)
        while !state.withLock({ $0.stopped }) {
            let request: HTTPMessage
            do {
                guard let next = try reader.next() else {
                    let count = try channel.read(into: &buffer, until: .now + .seconds(60))
                    if count == 0 { return }
                    reader.append(buffer[..<count])
                    continue
                }
                request = next
            } catch {
                _ = try? channel.write(Self.response(400, body: "malformed HTTP request").serialized(), until: .now + .seconds(5))
                return
            }
            let (response, then) = answer(request)
            if let onAnswer {
                onAnswer(Request(path: request.startLine.count > 1 ? request.startLine[1] : "", headers: request.headers,
                                 body: request.bodyText), response?.status ?? 0)
            }
            if case .closeAfterReading? = then { return }
            guard let response else {
                // A scripted timeout: hold the connection without answering.
                Thread.sleep(forTimeInterval: 30)
                return
            }
            if case .delay(let delay)? = then { Thread.sleep(forTimeInterval: delay.seconds) }
            do {
                try channel.write(response.serialized(), until: .now + .seconds(10))
            } catch {
                return
            }
            if !request.keepsAlive { channel.close(); return }
            if case .answerThenClose? = then {
                // close_notify and FIN go out before the count moves, so a client that waits
                // for the count finds the connection closed when it checks it.
                channel.close()
                _ = shutdown(channel.fd, Int32(SHUT_RDWR))
                state.withLock { $0.closedAfterAnswer += 1 }
                return
            }
        }
    }

    /// The answer to `request` (nil: none), and what the connection does after it.
    private func answer(_ request: HTTPMessage) -> (HTTPMessage?, Scripted?) {
        let path = request.startLine.count > 1 ? request.startLine[1] : ""
        let scripted = state.withLock { state -> Scripted? in
            if recordsRequests { state.requests.append(Request(path: path, headers: request.headers, body: request.bodyText)) }
            return state.scripted.isEmpty ? nil : state.scripted.removeFirst()
        }
        switch scripted {
        case .noAnswer?, .closeAfterReading?: return (nil, scripted)
        case .status(let status, let retryAfter)?:
            var response = Self.response(status, body: "")
            if let retryAfter { response.headers["retry-after"] = retryAfter }
            return (response, nil)
        case .answerThenClose?, .delay?, nil: return (normalAnswer(request, path: path), scripted)
        }
    }

    private func normalAnswer(_ request: HTTPMessage, path: String) -> HTTPMessage {
        guard request.startLine.first == "POST" else { return Self.response(405, body: "only POST is served") }
        guard request.headers["authorization"] == "key=\(serverKey)" else { return Self.response(401, body: "Unauthorized") }
        switch path {
        case "/fcm/send":
            if request.headers["content-type"]?.lowercased().hasPrefix("application/x-www-form-urlencoded") == true {
                return plainTextSend(request.bodyText)
            }
            return jsonSend(request.bodyText)
        case "/fcm/notification":
            guard request.headers["project_id"] == senderID else {
                return Self.json(401, ["error": .string("project_id does not match the server key's sender")])
            }
            return deviceGroup(request.bodyText)
        default:
            return Self.response(404, body: "not found")
        }
    }

    private func jsonSend(_ body: String) -> HTTPMessage {
        guard case .object(let members)? = try? JSONValue.parse(body) else {
            return Self.response(400, body: "JSON_PARSING_ERROR: Unexpected character at position 0.")
        }
        if let tokens = members["registration_ids"] {
            guard case .array(let items) = tokens, !items.isEmpty, items.allSatisfy({ $0.stringValue != nil }) else {
                return Self.response(400, body: "Field \"registration_ids\" must be a JSON array of strings")
            }
            guard items.count <= LegacyHTTPMessage.maximumRegistrationIDs else {
                return Self.response(400, body: "Number of messages on bulk (\(items.count)) exceeds maximum allowed (1000)")
            }
            return tokenResults(items.compactMap(\.stringValue))
        }
        if members["condition"]?.stringValue != nil { return topicResult() }
        guard let to = members["to"]?.stringValue ?? members["notification_key"]?.stringValue else {
            return Self.response(400, body: "Missing \"to\" or \"registration_ids\" field")
        }
        if to.hasPrefix("/topics/") { return topicResult() }
        if let members = state.withLock({ state in state.groups.values.first { $0.key == to }?.tokens }) {
            return groupResult(members)
        }
        return tokenResults([to])
    }

    /// FCM's answer to a send to a device group's notification key: how many members got
    /// it, and which did not (`failed_registration_ids`, only when some failed); no
    /// per-token `results`.
    private func groupResult(_ members: [String]) -> HTTPMessage {
        var failed: [String] = []
        for member in members {
            if case .error = tokenAnswer(member) { failed.append(member) }
        }
        var answer: [String: JSONValue] = ["success": .number(JSONNumber(Int(members.count - failed.count))),
                                           "failure": .number(JSONNumber(Int(failed.count)))]
        if !failed.isEmpty { answer["failed_registration_ids"] = .array(failed.map(JSONValue.string)) }
        return Self.json(200, answer)
    }

    private func tokenResults(_ tokens: [String]) -> HTTPMessage {
        var results: [JSONValue] = []
        var success = 0, failure = 0, canonical = 0
        for token in tokens {
            switch tokenAnswer(token) {
            case .success(let canonicalID):
                success += 1
                var result: [String: JSONValue] = ["message_id": .string("0:\(nextMessageID())%\(senderID)")]
                if let canonicalID {
                    canonical += 1
                    result["registration_id"] = .string(canonicalID)
                }
                results.append(.object(result))
            case .error(let code):
                failure += 1
                results.append(.object(["error": .string(code)]))
            }
        }
        return Self.json(200, ["multicast_id": .number(JSONNumber(Int(nextMessageID()))), "success": .number(JSONNumber(Int(success))),
                               "failure": .number(JSONNumber(Int(failure))), "canonical_ids": .number(JSONNumber(Int(canonical))),
                               "results": .array(results)])
    }

    private func topicResult() -> HTTPMessage {
        Self.json(200, ["message_id": .number(JSONNumber(Int(nextMessageID())))])
    }

    private func plainTextSend(_ body: String) -> HTTPMessage {
        var fields: [String: String] = [:]
        for pair in body.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map {
                String($0).replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? String($0)
            }
            fields[parts[0]] = parts.count > 1 ? parts[1] : ""
        }
        guard let token = fields["registration_id"], !token.isEmpty else { return Self.response(200, body: "Error=MissingRegistration") }
        switch tokenAnswer(token) {
        case .success(let canonical):
            return Self.response(200, body: "id=0:\(nextMessageID())%\(senderID)" + (canonical.map { "\nregistration_id=\($0)" } ?? ""))
        case .error(let code):
            return Self.response(200, body: "Error=\(code)")
        }
    }

    private func deviceGroup(_ body: String) -> HTTPMessage {
        guard case .object(let members)? = try? JSONValue.parse(body),
              let operation = members["operation"]?.stringValue,
              let name = members["notification_key_name"]?.stringValue, !name.isEmpty,
              case .array(let items)? = members["registration_ids"], !items.isEmpty else {
            return Self.json(400, ["error": .string("operation, notification_key_name and registration_ids are required")])
        }
        let tokens = items.compactMap(\.stringValue)
        let key = members["notification_key"]?.stringValue
        let outcome = state.withLock { state -> Result<String, SimulatorError> in
            switch operation {
            case "create":
                guard state.groups[name] == nil else { return .failure(SimulatorError("notification_key already exists")) }
                state.nextMessageID += 1
                let created = "APA91b-group-\(state.nextMessageID)"
                state.groups[name] = (created, tokens)
                return .success(created)
            case "add", "remove":
                guard let group = state.groups[name], group.key == key else { return .failure(SimulatorError("notification_key not found")) }
                if operation == "add" {
                    state.groups[name]!.tokens += tokens.filter { !group.tokens.contains($0) }
                } else {
                    state.groups[name]!.tokens.removeAll { tokens.contains($0) }
                    // Removing every token deletes the group.
                    if state.groups[name]!.tokens.isEmpty { state.groups[name] = nil }
                }
                return .success(group.key)
            default:
                return .failure(SimulatorError("unknown operation \(operation)"))
            }
        }
        switch outcome {
        case .success(let key): return Self.json(200, ["notification_key": .string(key)])
        case .failure(let reason): return Self.json(400, ["error": .string(reason.description)])
        }
    }

    private func nextMessageID() -> Int64 {
        state.withLock { state in
            state.nextMessageID += 1
            return state.nextMessageID
        }
    }

    private static func response(_ status: Int, body: String) -> HTTPMessage {
        HTTPMessage(startLine: ["HTTP/1.1", String(status), status == 200 ? "OK" : "Error"],
                    headers: ["content-type": "text/plain; charset=UTF-8"], body: Array(body.utf8))
    }

    private static func json(_ status: Int, _ members: [String: JSONValue]) -> HTTPMessage {
        HTTPMessage(startLine: ["HTTP/1.1", String(status), status == 200 ? "OK" : "Error"],
                    headers: ["content-type": "application/json; charset=UTF-8"], body: Array(JSONValue.object(members).serialized.utf8))
    }
}
