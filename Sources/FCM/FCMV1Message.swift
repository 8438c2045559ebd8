import Foundation
import Runtime

/// One request to FCM's HTTP v1 send API (`POST /v1/projects/{project}/messages:send`): the
/// `Message` object and `validate_only`, built from an outbox row.
///
/// A row's payload is either a v1 `Message` as is (`{"message": {…}, "validate_only": …}`)
/// or shaped for the legacy API, which is translated so that handlers written for XMPP keep
/// working: the target (`to`, a `/topics/` name, `condition`, each of `registration_ids`,
/// a device group's notification key as a `token`), `data` (values that are not strings
/// become their JSON text, as v1 requires strings), `notification`, `priority`,
/// `time_to_live`, `collapse_key`, `restricted_package_name`, `content_available`,
/// `mutable_content` and `dry_run` (`validate_only`). What v1 cannot carry
/// (`delivery_receipt_requested`) is refused before any request, with the field named.
public struct FCMV1Message: Sendable, Equatable {
    /// The `Message` object.
    public var message: [String: JSONValue]
    public var validateOnly: Bool
    /// What the row's results are kept under: the token, `/topics/NAME`, the condition, or the FID.
    public var target: String
    /// True when the target is a device's token or FID (a refusal marks it in `device_tokens`).
    public var targetIsDevice: Bool

    /// The top-level members of a v1 `Message`.
    public static let messageMembers: Set<String> = [
        "name", "data", "notification", "android", "apns", "webpush", "fcm_options", "token", "topic", "condition", "fid",
    ]
    /// The members that name the target; exactly one is set.
    public static let targetMembers = ["token", "topic", "condition", "fid"]

    /// The request body.
    public var body: JSONValue {
        var members: [String: JSONValue] = ["message": .object(message)]
        if validateOnly { members["validate_only"] = true }
        return .object(members)
    }

    /// The request body as it goes on the wire (compact JSON, keys in no particular order).
    public var wireBody: [UInt8] {
        var output: [UInt8] = []
        output.reserveCapacity(256)
        output.append(contentsOf: #"{"message":"#.utf8)
        JSONValue.object(message).writeUnsorted(to: &output)
        if validateOnly { output.append(contentsOf: #","validate_only":true"#.utf8) }
        output.append(UInt8(ascii: "}"))
        return output
    }

    /// The requests for an outbox row: one, or one per token of `registrationIDs` (those in
    /// `skipping` left out: tokens with a final outcome from an earlier attempt).
    ///
    /// A time to live counts from `queuedAt` (when the row was queued; `now` when nil):
    /// `android.ttl` and web push's `TTL` are what is left of it `now`, and `apns-expiration`
    /// is `queuedAt` plus the time to live, so that a retried message never outlives it.
    /// - Throws: `DownstreamValidationError` naming the field that is invalid or that v1
    ///   cannot carry.
    public static func requests(target: String?, condition: String?, registrationIDs: [String]?, payload: JSONValue,
                                skipping: Set<String> = [], queuedAt: Date? = nil,
                                now: Date = Date()) throws(DownstreamValidationError) -> [FCMV1Message] {
        guard case .object(let members) = payload else { throw .init("payload", "must be a JSON object") }
        let targets: [(String?, String?)]
        if let registrationIDs {
            guard !registrationIDs.isEmpty else { throw .init("registration_ids", "is empty") }
            targets = registrationIDs.filter { !skipping.contains($0) }.map { ($0, nil) }
        } else {
            targets = [(target, condition)]
        }
        var requests: [FCMV1Message] = []
        requests.reserveCapacity(targets.count)
        for (to, condition) in targets {
            var request: FCMV1Message
            if members["message"] != nil {
                request = try asIs(members, target: to, condition: condition)
                try request.validate()
                if let queuedAt { request.shortenTimeToLive(by: now.timeIntervalSince(queuedAt)) }
            } else {
                // Checked as a legacy message already, field by field, before it was built.
                request = try translated(members, target: to, condition: condition, queuedAt: queuedAt ?? now, now: now)
                request.targetIsDevice = request.message["token"] != nil
            }
            request.target = request.targetKey
            requests.append(request)
        }
        return requests
    }

    // MARK: - A v1 message as is

    private static func asIs(_ members: [String: JSONValue], target: String?, condition: String?) throws(DownstreamValidationError) -> FCMV1Message {
        for key in members.keys where key != "message" && key != "validate_only" {
            throw .init("payload.\(key)", "is beside a v1 message: a payload with message holds only message and validate_only")
        }
        guard case .object(var message)? = members["message"] else { throw .init("message", "must be a JSON object") }
        var validateOnly = false
        if let value = members["validate_only"] {
            guard case .bool(let flag) = value else { throw .init("validate_only", "must be true or false") }
            validateOnly = flag
        }
        let named = targetMembers.filter { message[$0] != nil }
        let rowTarget = Self.target(to: target, condition: condition)
        if named.isEmpty {
            for (key, value) in rowTarget { message[key] = value }
        } else if let (key, value) = rowTarget.first, named != [key] || message[key] != value {
            // The fid of a row names its target column too.
            if !(named == ["fid"] && key == "token" && message["fid"] == value) {
                throw .init("message.\(named.joined(separator: ","))", "differs from the row's target (\(target ?? condition ?? ""))")
            }
        }
        return FCMV1Message(message: message, validateOnly: validateOnly, target: "", targetIsDevice: false)
    }

    /// `token`, `topic` (without `/topics/`) or `condition`, from a row's columns.
    private static func target(to: String?, condition: String?) -> [String: JSONValue] {
        if let condition { return ["condition": .string(condition)] }
        guard let to else { return [:] }
        if to.hasPrefix("/topics/") { return ["topic": .string(String(to.dropFirst("/topics/".count)))] }
        return ["token": .string(to)]
    }

    // MARK: - Translation from the legacy shape

    private static func translated(_ members: [String: JSONValue], target: String?, condition: String?, queuedAt: Date,
                                   now: Date) throws(DownstreamValidationError) -> FCMV1Message {
        var legacy = members
        var packageName: String?
        if let value = legacy.removeValue(forKey: "restricted_package_name") {
            guard let text = value.stringValue, !text.isEmpty else { throw .init("restricted_package_name", "must be a non-empty string") }
            packageName = text
        }
        let parsed = try DownstreamMessage(target: target, condition: condition, payload: .object(legacy), messageID: "v1")
        // v1's own rule for data keys: an option's name (priority, collapse_key…) is a key like any other there.
        try parsed.validate(dataKeys: .v1)
        if parsed.deliveryReceiptRequested == true {
            throw .init("delivery_receipt_requested", "FCM's v1 API has no delivery receipts (send over xmpp for them)")
        }
        var message = Self.target(to: target, condition: condition)
        if let data = parsed.data {
            message["data"] = .object(data.mapValues { value in
                if case .string = value { return value }
                return .string(value.serialized)
            })
        }
        var android: [String: JSONValue] = [:]
        var apnsHeaders: [String: JSONValue] = [:]
        var aps: [String: JSONValue] = [:]
        var webpushHeaders: [String: JSONValue] = [:]
        if let notification = parsed.notification {
            var common: [String: JSONValue] = [:]
            if let title = notification.title { common["title"] = .string(title) }
            if let body = notification.body { common["body"] = .string(body) }
            if !common.isEmpty { message["notification"] = .object(common) }
            var androidNotification: [String: JSONValue] = [:]
            let androidFields: [(String, String?)] = [
                ("icon", notification.icon), ("color", notification.color), ("sound", notification.sound), ("tag", notification.tag),
                ("click_action", notification.clickAction), ("body_loc_key", notification.bodyLocKey),
                ("title_loc_key", notification.titleLocKey), ("channel_id", notification.androidChannelID),
            ]
            for case (let key, let value?) in androidFields { androidNotification[key] = .string(value) }
            for case (let key, let value?) in [("body_loc_args", notification.bodyLocArgs), ("title_loc_args", notification.titleLocArgs)] {
                // Validated as a JSON array of strings; v1 takes the array itself.
                androidNotification[key] = (try? JSONValue.parse(value)) ?? .array([])
            }
            if !androidNotification.isEmpty { android["notification"] = .object(androidNotification) }
            if let sound = notification.sound { aps["sound"] = .string(sound) }
            if let badge = notification.badge {
                guard let count = Int(badge) else { throw .init("notification.badge", "must be a whole number for v1's apns badge") }
                aps["badge"] = .number(JSONNumber(count))
            }
            if let subtitle = notification.subtitle {
                var alert = common
                alert["subtitle"] = .string(subtitle)
                aps["alert"] = .object(alert)
            }
            if let category = notification.clickAction { aps["category"] = .string(category) }
        }
        if parsed.contentAvailable == true { aps["content-available"] = 1 }
        if parsed.mutableContent == true { aps["mutable-content"] = 1 }
        // Priority per platform: Android's as given; Apple's 10 only for a message that
        // alerts the user (Apple and FCM refuse 10 for a background push with
        // INVALID_ARGUMENT), 5 with the background push type for content_available, and no
        // APNs priority for a data message that does neither.
        let alerts = message["notification"] != nil || aps["alert"] != nil || aps["sound"] != nil || aps["badge"] != nil
        if let priority = parsed.priority {
            android["priority"] = priority == .high ? "HIGH" : "NORMAL"
            if alerts { apnsHeaders["apns-priority"] = priority == .high ? "10" : "5" }
        }
        if !alerts, parsed.contentAvailable == true {
            apnsHeaders["apns-priority"] = "5"
            apnsHeaders["apns-push-type"] = "background"
        }
        if let seconds = parsed.timeToLive {
            // Counted from when the row was queued, not from this attempt.
            let left = seconds == 0 ? 0 : max(0, seconds - Int(now.timeIntervalSince(queuedAt)))
            android["ttl"] = .string("\(left)s")
            apnsHeaders["apns-expiration"] = .string(seconds == 0 ? "0" : String(Int(queuedAt.timeIntervalSince1970) + seconds))
            webpushHeaders["TTL"] = .string(String(left))
        }
        if let collapseKey = parsed.collapseKey {
            android["collapse_key"] = .string(collapseKey)
            apnsHeaders["apns-collapse-id"] = .string(collapseKey)
        }
        if let packageName { android["restricted_package_name"] = .string(packageName) }
        if !android.isEmpty { message["android"] = .object(android) }
        var apns: [String: JSONValue] = [:]
        if !apnsHeaders.isEmpty { apns["headers"] = .object(apnsHeaders) }
        if !aps.isEmpty { apns["payload"] = ["aps": .object(aps)] }
        if !apns.isEmpty { message["apns"] = .object(apns) }
        if !webpushHeaders.isEmpty { message["webpush"] = ["headers": .object(webpushHeaders)] }
        return FCMV1Message(message: message, validateOnly: parsed.dryRun == true, target: "", targetIsDevice: false)
    }

    /// A v1 message sent `elapsed` seconds after it was queued: its relative times to live
    /// (`android.ttl`, web push's `TTL` header) shortened by that much (not below 0).
    mutating func shortenTimeToLive(by elapsed: TimeInterval) {
        let spent = Int(elapsed)
        guard spent >= 1 else { return }
        if case .object(var android)? = message["android"], let ttl = android["ttl"]?.stringValue, Self.isDuration(ttl),
           let seconds = Double(ttl.dropLast()), seconds > 0 {
            android["ttl"] = .string("\(max(0, Int(seconds) - spent))s")
            message["android"] = .object(android)
        }
        if case .object(var webpush)? = message["webpush"], case .object(var headers)? = webpush["headers"],
           let ttl = headers["TTL"]?.stringValue, let seconds = Int(ttl), seconds > 0 {
            headers["TTL"] = .string(String(max(0, seconds - spent)))
            webpush["headers"] = .object(headers)
            message["webpush"] = .object(webpush)
        }
    }

    // MARK: - Rules

    /// The member naming the target and its value as the row's results keep it.
    private var targetKey: String {
        if let token = message["token"]?.stringValue { return token }
        if let topic = message["topic"]?.stringValue { return "/topics/\(topic)" }
        if let condition = message["condition"]?.stringValue { return condition }
        return message["fid"]?.stringValue ?? ""
    }

    /// Checks what FCM's v1 API refuses with `INVALID_ARGUMENT` and can be known before
    /// sending: one target, well-formed; `data` of strings under keys FCM allows; known
    /// members; Android's `ttl` and `priority`; the 4,096-byte payload limit.
    /// - Throws: `DownstreamValidationError` naming the field (`message.…`).
    public mutating func validate() throws(DownstreamValidationError) {
        for key in message.keys.sorted() where !Self.messageMembers.contains(key) {
            throw .init("message.\(key)", "is not a field of a v1 message")
        }
        let named = Self.targetMembers.filter { message[$0] != nil }
        guard named.count == 1, let key = named.first else {
            throw .init("message", named.isEmpty ? "has no target: set one of token, topic, condition, fid"
                                                  : "names \(named.joined(separator: " and ")): set exactly one target")
        }
        guard let value = message[key]?.stringValue, !value.isEmpty else { throw .init("message.\(key)", "must be a non-empty string") }
        switch key {
        case "topic":
            guard DownstreamMessage.isTopicName(value) else { throw .init("message.topic", "\(value) is not a valid topic (letters, digits, -_.~%)") }
        case "condition":
            do {
                try DownstreamMessage.validateCondition(value)
            } catch {
                throw .init("message.condition", error.reason)
            }
        default:
            guard !DownstreamMessage.containsWhitespace(value) else { throw .init("message.\(key)", "has whitespace") }
        }
        targetIsDevice = key == "token" || key == "fid"
        var payloadBytes = 0
        if let data = message["data"] {
            guard case .object(let entries) = data else { throw .init("message.data", "must be a JSON object of strings") }
            for (name, value) in entries.sorted(by: { $0.key < $1.key }) {
                guard case .string(let text) = value else { throw .init("message.data.\(name)", "must be a string (v1 data values are strings)") }
                let lower = name.lowercased()
                if name.isEmpty || lower == "from" || lower == "message_type" || lower.hasPrefix("google") || lower.hasPrefix("gcm") {
                    throw .init("message.data.\(name)", "is a reserved key (from, message_type, google…, gcm…)")
                }
                payloadBytes += name.utf8.count + text.utf8.count
            }
        }
        if let notification = message["notification"] {
            guard case .object(let fields) = notification else { throw .init("message.notification", "must be a JSON object") }
            for (name, value) in fields {
                guard ["title", "body", "image"].contains(name) else { throw .init("message.notification.\(name)", "is not a field of a v1 notification") }
                guard let text = value.stringValue else { throw .init("message.notification.\(name)", "must be a string") }
                payloadBytes += name.utf8.count + text.utf8.count
            }
        }
        for member in ["android", "apns", "webpush", "fcm_options"] {
            if let value = message[member], value.objectValue == nil { throw .init("message.\(member)", "must be a JSON object") }
        }
        if let android = message["android"]?.objectValue {
            if let ttl = android["ttl"] {
                guard let text = ttl.stringValue, Self.isDuration(text) else {
                    throw .init("message.android.ttl", "must be a duration in seconds such as \"3600s\"")
                }
                let seconds = Double(text.dropLast()) ?? -1
                guard (0...Double(DownstreamMessage.maximumTimeToLive)).contains(seconds) else {
                    throw .init("message.android.ttl", "\(text) is outside 0…\(DownstreamMessage.maximumTimeToLive)s")
                }
            }
            // FCM reads enum names in either case (the Admin SDKs send "high").
            if let priority = android["priority"], !["NORMAL", "HIGH"].contains(priority.stringValue?.uppercased() ?? "") {
                throw .init("message.android.priority", "must be NORMAL or HIGH")
            }
        }
        let limit = key == "token" || key == "fid" ? DownstreamMessage.maximumPayloadBytes : DownstreamMessage.maximumTopicPayloadBytes
        if payloadBytes > limit {
            throw .init("message.data", "payload is \(payloadBytes) bytes, over the \(limit)-byte limit")
        }
    }

    /// `"3600s"`, `"0.5s"`: google.protobuf.Duration's JSON form, whole or with up to 9 decimals.
    public static func isDuration(_ text: String) -> Bool {
        guard text.hasSuffix("s") else { return false }
        let number = text.dropLast().split(separator: ".", omittingEmptySubsequences: false)
        guard (1...2).contains(number.count), !number[0].isEmpty, number[0].allSatisfy(\.isASCII), number[0].allSatisfy(\.isNumber) else {
            return false
        }
        if number.count == 2 { return (1...9).contains(number[1].count) && number[1].allSatisfy { $0.isASCII && $0.isNumber } }
        return true
    }
}
