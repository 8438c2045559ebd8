import Runtime

/// A downstream message (app server → FCM) with every field of docs/protocol.md section 3.
///
/// `validate()` refuses what FCM would refuse (and what it would silently rewrite), naming
/// the field, so that an invalid message never reaches FCM. `json` is the CCS wire form;
/// `time_to_live: 0` ("now or never") is written out, never omitted.
public struct DownstreamMessage: Sendable, Equatable {
    public enum Priority: String, Sendable, Equatable {
        case normal, high
    }

    /// User-visible notification keys (Apple, Android and Web).
    public struct Notification: Sendable, Equatable {
        public var title: String?
        public var body: String?
        public var sound: String?
        public var badge: String?
        public var clickAction: String?
        public var subtitle: String?
        public var bodyLocKey: String?
        /// A JSON array of strings, as a string (FCM's format).
        public var bodyLocArgs: String?
        public var titleLocKey: String?
        /// A JSON array of strings, as a string (FCM's format).
        public var titleLocArgs: String?
        public var androidChannelID: String?
        public var icon: String?
        public var tag: String?
        /// `#rrggbb`.
        public var color: String?

        public init(title: String? = nil, body: String? = nil) {
            self.title = title
            self.body = body
        }

        var fields: [(String, String?)] {
            [("title", title), ("body", body), ("sound", sound), ("badge", badge), ("click_action", clickAction),
             ("subtitle", subtitle), ("body_loc_key", bodyLocKey), ("body_loc_args", bodyLocArgs),
             ("title_loc_key", titleLocKey), ("title_loc_args", titleLocArgs), ("android_channel_id", androidChannelID),
             ("icon", icon), ("tag", tag), ("color", color)]
        }
    }

    /// A registration token, a device-group notification key, or `/topics/NAME`.
    public var to: String?
    /// A topic condition such as `'a' in topics && ('b' in topics || 'c' in topics)`.
    public var condition: String?
    public var messageID: String
    public var collapseKey: String?
    public var priority: Priority?
    public var contentAvailable: Bool?
    public var mutableContent: Bool?
    /// Seconds, 0 to 2,419,200 (4 weeks, FCM's default when nil).
    public var timeToLive: Int?
    public var dryRun: Bool?
    /// Ask FCM for a delivery receipt (XMPP only).
    public var deliveryReceiptRequested: Bool?
    public var data: [String: JSONValue]?
    public var notification: Notification?

    public init(to: String, messageID: String, data: [String: JSONValue]? = nil) {
        self.to = to
        self.messageID = messageID
        self.data = data
    }

    /// Options and payload only, for protocols that carry the target elsewhere (HTTP).
    init(messageID: String, data: [String: JSONValue]?) {
        self.messageID = messageID
        self.data = data
    }

    public init(condition: String, messageID: String, data: [String: JSONValue]? = nil) {
        self.condition = condition
        self.messageID = messageID
        self.data = data
    }

    /// The longest time to live FCM accepts: 4 weeks.
    public static let maximumTimeToLive = 2_419_200
    /// The payload limit (keys and values of `data` and `notification`), in bytes.
    public static let maximumPayloadBytes = 4096
    /// The payload limit for topic messages.
    public static let maximumTopicPayloadBytes = 2048

    /// The option and target names of section 3, which `data` must not use.
    static let reservedDataKeys: Set<String> = [
        "from", "message_type", "to", "condition", "message_id", "collapse_key", "priority", "content_available",
        "mutable_content", "time_to_live", "dry_run", "delivery_receipt_requested", "data", "notification",
    ]

    /// True for a `data` key FCM keeps for itself: empty, an option's or a field's name, or
    /// starting with `google` or `gcm`, in any case.
    static func isReservedDataKey(_ key: String) -> Bool {
        let lower = key.lowercased()
        return key.isEmpty || reservedDataKeys.contains(lower) || lower.hasPrefix("google") || lower.hasPrefix("gcm")
    }

    /// True for messages to a topic or a condition (the smaller payload limit applies).
    public var isTopicMessage: Bool { condition != nil || to?.hasPrefix("/topics/") == true }

    /// Which `data` keys a send refuses.
    public enum DataKeyRule: Sendable {
        /// The legacy APIs' (CCS, legacy HTTP): FCM's own keys and every option's name.
        case legacy
        /// HTTP v1's: `from`, `message_type` and keys starting with `google` or `gcm` only
        /// (an option's name, such as `priority` or `collapse_key`, is an ordinary key there).
        case v1
    }

    /// True for a `data` key HTTP v1 keeps for itself: empty, `from`, `message_type`, or
    /// starting with `google` or `gcm`, in any case.
    public static func isReservedV1DataKey(_ key: String) -> Bool {
        let lower = key.lowercased()
        return key.isEmpty || lower == "from" || lower == "message_type" || lower.hasPrefix("google") || lower.hasPrefix("gcm")
    }

    /// Checks every rule of section 3 (`dataKeys`: whose reserved `data` keys apply).
    /// - Throws: `DownstreamValidationError` naming the first offending field.
    public func validate(dataKeys: DataKeyRule = .legacy) throws(DownstreamValidationError) {
        switch (to, condition) {
        case (nil, nil): throw .init("to", "a message needs a target: set to or condition")
        case (.some, .some): throw .init("condition", "set either to or condition, not both")
        case (let target?, nil):
            guard !target.isEmpty else { throw .init("to", "is empty") }
            if target.hasPrefix("/topics/") {
                let name = String(target.dropFirst("/topics/".count))
                guard Self.isTopicName(name) else { throw .init("to", "\(target) is not a valid topic (letters, digits, -_.~%)") }
            } else if Self.containsWhitespace(target) {
                throw .init("to", "a registration token or notification key has no whitespace")
            }
        case (nil, let expression?):
            try Self.validateCondition(expression)
        }
        guard !messageID.isEmpty else { throw .init("message_id", "is required") }
        if let timeToLive, !(0...Self.maximumTimeToLive).contains(timeToLive) {
            throw .init("time_to_live", "\(timeToLive) is outside 0…\(Self.maximumTimeToLive) seconds")
        }
        if let collapseKey, collapseKey.isEmpty { throw .init("collapse_key", "is empty") }
        if let data {
            // The first reserved key in key order, found without sorting every message's keys.
            var reserved: String?
            let isReserved = dataKeys == .legacy ? Self.isReservedDataKey : Self.isReservedV1DataKey
            for key in data.keys where isReserved(key) {
                if reserved.map({ key < $0 }) ?? true { reserved = key }
            }
            if let reserved {
                throw .init("data.\(reserved)", dataKeys == .legacy ? "is a reserved key (from, message_type, google…, gcm…, or an option name)"
                                                                     : "is a reserved key (from, message_type, google…, gcm…)")
            }
        }
        if let notification {
            if let color = notification.color, !Self.isColor(color) {
                throw .init("notification.color", "\(color) is not #rrggbb")
            }
            for (name, value) in [("body_loc_args", notification.bodyLocArgs), ("title_loc_args", notification.titleLocArgs)] {
                guard let value else { continue }
                guard case .array(let items)? = try? JSONValue.parse(value), items.allSatisfy({ $0.stringValue != nil }) else {
                    throw .init("notification.\(name)", "must be a JSON array of strings")
                }
            }
            for (name, value) in [("icon", notification.icon), ("click_action", notification.clickAction)] {
                if let value, value.lowercased().hasPrefix("http://") {
                    throw .init("notification.\(name)", "URLs must be HTTPS")
                }
            }
        }
        let limit = isTopicMessage ? Self.maximumTopicPayloadBytes : Self.maximumPayloadBytes
        let size = payloadBytes
        if size > limit {
            throw .init(data != nil ? "data" : "notification", "payload is \(size) bytes, over the \(limit)-byte limit\(isTopicMessage ? " for topic messages" : "")")
        }
    }

    /// Bytes of the payload's keys and values (`data` and `notification`), as FCM counts them.
    public var payloadBytes: Int {
        var total = 0
        for (key, value) in data ?? [:] {
            total += key.utf8.count
            if case .string(let text) = value { total += text.utf8.count } else { total += value.serialized.utf8.count }
        }
        for (key, value) in notification?.fields ?? [] {
            if let value { total += key.utf8.count + value.utf8.count }
        }
        return total
    }

    /// The CCS JSON object (inside `<gcm>`).
    public var json: JSONValue {
        var members: [String: JSONValue] = ["message_id": .string(messageID)]
        if let to { members["to"] = .string(to) }
        if let condition { members["condition"] = .string(condition) }
        if let collapseKey { members["collapse_key"] = .string(collapseKey) }
        if let priority { members["priority"] = .string(priority.rawValue) }
        if let contentAvailable { members["content_available"] = .bool(contentAvailable) }
        if let mutableContent { members["mutable_content"] = .bool(mutableContent) }
        if let timeToLive { members["time_to_live"] = .number(JSONNumber(timeToLive)) }
        if let dryRun { members["dry_run"] = .bool(dryRun) }
        if let deliveryReceiptRequested { members["delivery_receipt_requested"] = .bool(deliveryReceiptRequested) }
        if let data { members["data"] = .object(data) }
        if let notification {
            var fields: [String: JSONValue] = [:]
            for (key, value) in notification.fields { if let value { fields[key] = .string(value) } }
            members["notification"] = .object(fields)
        }
        return .object(members)
    }

    static func isTopicName(_ name: String) -> Bool {
        !name.isEmpty && name.unicodeScalars.allSatisfy {
            isASCIIAlphanumeric($0) || "-_.~%".unicodeScalars.contains($0)
        }
    }

    /// Whitespace anywhere in `text` (bytes first: tokens are ASCII, and this runs per message).
    static func containsWhitespace(_ text: String) -> Bool {
        var nonASCII = false
        for byte in text.utf8 {
            if byte == 0x20 || (0x09...0x0D).contains(byte) { return true }
            if byte >= 0x80 { nonASCII = true }
        }
        return nonASCII && text.contains(where: { $0.isWhitespace })
    }

    static func isASCIIAlphanumeric(_ scalar: Unicode.Scalar) -> Bool {
        ("a"..."z").contains(scalar) || ("A"..."Z").contains(scalar) || ("0"..."9").contains(scalar)
    }

    static func isColor(_ text: String) -> Bool {
        let scalars = Array(text.unicodeScalars)
        return scalars.count == 7 && scalars[0] == "#" && scalars[1...].allSatisfy { $0.properties.isASCIIHexDigit }
    }

    /// A condition is `'topic' in topics` terms joined by `&&`/`||`, with parentheses, and at
    /// most two operators.
    static func validateCondition(_ expression: String) throws(DownstreamValidationError) {
        var scalars = Array(expression.unicodeScalars)[...]
        var operators = 0, depth = 0, expectTerm = true, terms = 0
        func skipSpaces() { while let first = scalars.first, first == " " { scalars = scalars.dropFirst() } }
        while true {
            skipSpaces()
            guard let first = scalars.first else { break }
            if expectTerm {
                if first == "(" { depth += 1; scalars = scalars.dropFirst(); continue }
                guard first == "'" || first == "\"" else { throw .init("condition", "expected 'topic' in topics at \"\(String(String.UnicodeScalarView(scalars)).prefix(20))\"") }
                scalars = scalars.dropFirst()
                guard let close = scalars.firstIndex(of: first) else { throw .init("condition", "an unterminated topic name") }
                let name = String(String.UnicodeScalarView(scalars[scalars.startIndex..<close]))
                guard isTopicName(name) else { throw .init("condition", "\(name) is not a valid topic name") }
                scalars = scalars[scalars.index(after: close)...]
                skipSpaces()
                let keyword = Array(" in topics".unicodeScalars.dropFirst())
                guard scalars.starts(with: keyword) else { throw .init("condition", "expected `in topics` after '\(name)'") }
                scalars = scalars.dropFirst(keyword.count)
                terms += 1
                expectTerm = false
            } else {
                if first == ")" {
                    depth -= 1
                    guard depth >= 0 else { throw .init("condition", "unbalanced parentheses") }
                    scalars = scalars.dropFirst()
                    continue
                }
                let two = String(String.UnicodeScalarView(scalars.prefix(2)))
                guard two == "&&" || two == "||" else { throw .init("condition", "expected && or || between terms") }
                operators += 1
                scalars = scalars.dropFirst(2)
                expectTerm = true
            }
        }
        guard terms > 0, !expectTerm else { throw .init("condition", "ends without a term") }
        guard depth == 0 else { throw .init("condition", "unbalanced parentheses") }
        guard operators <= 2 else { throw .init("condition", "has \(operators) operators; FCM allows at most 2") }
    }
}

/// Why a downstream message cannot be sent: the field and what is wrong with it.
public struct DownstreamValidationError: Error, Equatable, Sendable, CustomStringConvertible {
    public let field: String
    public let reason: String

    public init(_ field: String, _ reason: String) {
        self.field = field
        self.reason = reason
    }

    public var description: String { "invalid downstream message: \(field) \(reason)" }
}
