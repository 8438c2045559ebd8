import Runtime

extension DownstreamMessage {
    /// The option names an outbox payload may carry beside `data` and `notification`.
    static let payloadOptions: Set<String> = [
        "collapse_key", "priority", "content_available", "mutable_content", "time_to_live", "dry_run",
        "delivery_receipt_requested",
    ]

    /// Builds the message an outbox row describes: its `target` (`to`) or `condition`
    /// column, and its `payload` object (`data`, `notification` and the options of
    /// docs/protocol.md section 3). `messageID` is the worker's id for the row; a `message_id`
    /// in the payload is ignored, so that answers always map back to the row.
    ///
    /// - Throws: `DownstreamValidationError` naming the payload field that is not a field
    ///   of a downstream message or has the wrong type. Call `validate()` afterwards for
    ///   FCM's value rules.
    public init(target: String?, condition: String?, payload: JSONValue, messageID: String) throws(DownstreamValidationError) {
        guard case .object(let members) = payload else { throw .init("payload", "must be a JSON object") }
        self.messageID = messageID
        self.to = target
        self.condition = condition
        // In the dictionary's order, which costs no sort; only a payload that fails is read
        // again in key order, so that the error names the same member every time.
        do {
            for (key, value) in members { try take(member: key, value) }
        } catch {
            for (key, value) in members.sorted(by: { $0.key < $1.key }) { try take(member: key, value) }
            throw error
        }
    }

    /// Sets the field that payload member `key` holds.
    private mutating func take(member key: String, _ value: JSONValue) throws(DownstreamValidationError) {
        switch key {
        case "message_id": return
        case "to", "condition":
            throw .init("payload.\(key)", "belongs in the row's target or condition column, not in the payload")
        case "data":
            guard case .object(let data) = value else { throw .init("data", "must be a JSON object") }
            self.data = data
        case "notification":
            self.notification = try Self.notification(from: value)
        case "collapse_key": collapseKey = try Self.string(value, key)
        case "priority":
            guard let text = value.stringValue, let priority = Priority(rawValue: text) else {
                throw .init("priority", "must be \"normal\" or \"high\"")
            }
            self.priority = priority
        case "content_available": contentAvailable = try Self.bool(value, key)
        case "mutable_content": mutableContent = try Self.bool(value, key)
        case "dry_run": dryRun = try Self.bool(value, key)
        case "delivery_receipt_requested": deliveryReceiptRequested = try Self.bool(value, key)
        case "time_to_live":
            guard case .number(let number) = value, let seconds = number.int64Value, abs(seconds) < 1_000_000_000_000 else {
                throw .init("time_to_live", "must be a whole number of seconds")
            }
            timeToLive = Int(seconds)
        default:
            throw .init("payload.\(key)", "is not a field of a downstream message (data, notification, \(Self.payloadOptions.sorted().joined(separator: ", ")))")
        }
    }

    private static func string(_ value: JSONValue, _ field: String) throws(DownstreamValidationError) -> String {
        guard let text = value.stringValue else { throw .init(field, "must be a string") }
        return text
    }

    private static func bool(_ value: JSONValue, _ field: String) throws(DownstreamValidationError) -> Bool {
        guard case .bool(let flag) = value else { throw .init(field, "must be true or false") }
        return flag
    }

    private static func notification(from value: JSONValue) throws(DownstreamValidationError) -> Notification {
        guard case .object(let members) = value else { throw .init("notification", "must be a JSON object") }
        var notification = Notification()
        for (key, value) in members.sorted(by: { $0.key < $1.key }) {
            let field = "notification.\(key)"
            let text: String
            switch value {
            case .string(let string): text = string
            case .number, .bool:
                // FCM takes badge "3" and badge 3 alike; keep the text form.
                guard key == "badge" else { throw .init(field, "must be a string") }
                text = value.serialized
            case .array where key == "body_loc_args" || key == "title_loc_args":
                text = value.serialized
            default: throw .init(field, "must be a string")
            }
            switch key {
            case "title": notification.title = text
            case "body": notification.body = text
            case "sound": notification.sound = text
            case "badge": notification.badge = text
            case "click_action": notification.clickAction = text
            case "subtitle": notification.subtitle = text
            case "body_loc_key": notification.bodyLocKey = text
            case "body_loc_args": notification.bodyLocArgs = text
            case "title_loc_key": notification.titleLocKey = text
            case "title_loc_args": notification.titleLocArgs = text
            case "android_channel_id": notification.androidChannelID = text
            case "icon": notification.icon = text
            case "tag": notification.tag = text
            case "color": notification.color = text
            default: throw .init(field, "is not a notification key (Apple, Android or Web)")
            }
        }
        return notification
    }
}
