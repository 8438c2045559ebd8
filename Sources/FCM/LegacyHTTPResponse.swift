import Foundation
import Runtime

/// What FCM's legacy HTTP endpoint answered to `POST /fcm/send` with status 200
/// (docs/protocol.md section 8), parsed in full.
public enum LegacyHTTPResponse: Sendable, Equatable {
    /// One token's outcome: a `message_id` (with, perhaps, the canonical token to use from
    /// now on), or an `error`.
    public struct Result: Sendable, Equatable {
        public var messageID: String?
        public var canonicalRegistrationID: String?
        public var error: String?

        public init(messageID: String? = nil, canonicalRegistrationID: String? = nil, error: String? = nil) {
            self.messageID = messageID
            self.canonicalRegistrationID = canonicalRegistrationID
            self.error = error
        }

        /// What the worker does about this result's error (nil when it succeeded).
        public var action: NackAction? { error.map(NackAction.init(httpError:)) }
    }

    /// The JSON answer to a token or multicast request: one result per token, in the
    /// request's order.
    case tokens(multicastID: Int64?, success: Int, failure: Int, canonicalIDs: Int, results: [Result])
    /// The JSON answer to a topic or condition request.
    case topic(messageID: Int64?, error: String?)
    /// The JSON answer to a send to a device group's notification key: how many of its
    /// members got the message, and the tokens of those that did not.
    case group(success: Int, failure: Int, failedRegistrationIDs: [String])
    /// The plain-text answer (`id=…` and maybe `registration_id=…`, or `Error=…`).
    case plainText(Result)

    /// Why a request got no 200 answer, or an unreadable one.
    public enum Failure: Error, Sendable, Equatable, CustomStringConvertible {
        /// 400: the JSON could not be parsed or a field is invalid; fix before retrying.
        case badRequest(String)
        /// 401: the server key was refused. A configuration error: never retried.
        case unauthorized
        /// 5xx: FCM failed or is unavailable; retry after `retryAfter` if it said, else
        /// with exponential backoff.
        case unavailable(status: Int, retryAfter: Duration?)
        /// Any other status, or a 200 whose body is not what the protocol says.
        case unexpected(status: Int, detail: String)

        public var description: String {
            switch self {
            case .badRequest(let reason): "FCM refused the request (400): \(reason)"
            case .unauthorized: "FCM refused the server key (401): check --server-key"
            case .unavailable(let status, let retryAfter):
                "FCM is unavailable (\(status))" + (retryAfter.map { ", retry after \($0.formattedSeconds)" } ?? "")
            case .unexpected(let status, let detail): "unexpected answer from FCM (\(status)): \(detail)"
            }
        }
    }

    /// Parses an HTTP answer. `plainText` says the request was the plain-text form;
    /// `tokens` is how many tokens the JSON request carried (its results must match).
    public static func parse(status: Int, retryAfter: String?, body: String, plainText: Bool,
                             tokens: Int?, now: Date = Date()) throws(Failure) -> LegacyHTTPResponse {
        switch status {
        case 200: break
        case 400: throw .badRequest(body.trimmingCharacters(in: .whitespacesAndNewlines).prefix(300).description)
        case 401: throw .unauthorized
        case 500...599: throw .unavailable(status: status, retryAfter: retryAfter.flatMap { parseRetryAfter($0, now: now) })
        default: throw .unexpected(status: status, detail: body.prefix(200).description)
        }
        if plainText { return .plainText(try parsePlainText(body)) }
        guard case .object(let members)? = try? JSONValue.parse(body) else {
            throw .unexpected(status: status, detail: "the body is not a JSON object: \(body.prefix(120))")
        }
        guard let resultsValue = members["results"] else {
            // A device group's answer counts its members; a topic's carries a message id or an error.
            if members["message_id"] == nil, members["error"] == nil,
               let success = members["success"].flatMap(integer), let failure = members["failure"].flatMap(integer) {
                let failed = members["failed_registration_ids"]?.arrayValue?.compactMap(\.stringValue) ?? []
                return .group(success: Int(success), failure: Int(failure), failedRegistrationIDs: failed)
            }
            return .topic(messageID: members["message_id"].flatMap(integer), error: members["error"]?.stringValue)
        }
        guard case .array(let items) = resultsValue else { throw .unexpected(status: status, detail: "results is not an array") }
        let results = items.map { item in
            Result(messageID: item["message_id"]?.stringValue ?? item["message_id"].flatMap(integer).map(String.init),
                   canonicalRegistrationID: item["registration_id"]?.stringValue, error: item["error"]?.stringValue)
        }
        if let tokens, results.count != tokens {
            throw .unexpected(status: status, detail: "\(results.count) results for \(tokens) tokens")
        }
        return .tokens(multicastID: members["multicast_id"].flatMap(integer),
                       success: members["success"].flatMap(integer).map(Int.init) ?? results.count { $0.error == nil },
                       failure: members["failure"].flatMap(integer).map(Int.init) ?? results.count { $0.error != nil },
                       canonicalIDs: members["canonical_ids"].flatMap(integer).map(Int.init)
                           ?? results.count { $0.canonicalRegistrationID != nil },
                       results: results)
    }

    /// `Retry-After` as delta-seconds or an HTTP date.
    public static func parseRetryAfter(_ text: String, now: Date = Date()) -> Duration? {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        if let seconds = Int(trimmed), seconds >= 0 { return .seconds(seconds) }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        guard let date = formatter.date(from: trimmed) else { return nil }
        return .milliseconds(Int64(max(0, date.timeIntervalSince(now)) * 1000))
    }

    private static func parsePlainText(_ body: String) throws(Failure) -> Result {
        var result = Result()
        for line in body.split(whereSeparator: \.isNewline) {
            let parts = line.split(separator: "=", maxSplits: 1).map(String.init)
            guard parts.count == 2 else { continue }
            switch parts[0] {
            case "id": result.messageID = parts[1]
            case "registration_id": result.canonicalRegistrationID = parts[1]
            case "Error": result.error = parts[1]
            default: continue
            }
        }
        guard result.messageID != nil || result.error != nil else {
            throw .unexpected(status: 200, detail: "a plain-text answer without id= or Error=: \(body.prefix(120))")
        }
        return result
    }

    private static func integer(_ value: JSONValue) -> Int64? {
        if case .number(let number) = value { return number.int64Value }
        if case .string(let text) = value { return Int64(text) }
        return nil
    }
}

extension NackAction {
    /// The action for a legacy HTTP per-token error (section 8), mirroring the XMPP codes.
    public init(httpError: String) {
        switch httpError {
        case "InvalidRegistration": self = .failAndMarkToken(.invalid)
        case "NotRegistered": self = .failAndMarkToken(.unregistered)
        case "Unavailable", "InternalServerError": self = .retryWithBackoff
        case "DeviceMessageRateExceeded": self = .slowDown(.device)
        case "TopicsMessageRateExceeded": self = .slowDown(.topic)
        case "MissingRegistration", "InvalidPackageName", "MismatchSenderId", "InvalidParameters", "MessageTooBig",
             "InvalidDataKey", "InvalidTtl",
             "InvalidApnsCredential":
            self = .fail
        default: self = .retryWithBackoff
        }
    }
}
