import FCM
import Foundation
import Runtime

/// One message a device posted (`POST /v1/messages`, or one of `POST /v1/messages:batch`),
/// checked against FCM's old upstream limits. Unknown members are ignored (a newer client
/// may send more).
public struct IngressMessage: Sendable, Equatable {
    /// The device's id for the message: unique per sender, the key of exactly-once handling.
    public let messageID: String
    public let data: [String: String]
    /// `data` as JSON text, members as sent.
    public let dataJSON: String
    public let category: String?
    /// The device's FCM registration token: the message's `from`, where replies go.
    public let token: String?
    public let timeToLive: Int?

    /// FCM's upstream limit on `data`: its keys and values together, in bytes of UTF-8.
    public static let maximumDataBytes = 4096
    /// The longest `data` text kept as the device sent it (`dataJSON`); a longer one that is
    /// within the limit (whitespace, escapes) is kept written anew, compactly.
    static let maximumSentDataBytes = 2 * maximumDataBytes
    /// The longest `message_id`, `category` accepted.
    public static let maximumIDLength = 256
    /// The longest registration token accepted (FCM's are about 160 characters).
    public static let maximumTokenLength = 1024
    /// The most messages in one batch (a device coming back online with its queue).
    public static let maximumBatch = 100

    /// Reads one message object.
    /// - Throws: `IngressMessage.Invalid` naming the member that is wrong.
    public init(_ value: JSONValue) throws(Invalid) {
        try self.init(value, dataJSON: nil)
    }

    /// - Parameter sentData: `data`'s text as sent, when known (kept as `dataJSON`).
    private init(_ value: JSONValue, dataJSON sentData: String?) throws(Invalid) {
        guard case .object(let members) = value else { throw Invalid("a message must be a JSON object") }
        guard case .string(let id)? = members["message_id"], !id.isEmpty else { throw Invalid("message_id is missing or not a non-empty string") }
        try Self.checkID(id)
        let data: [String: String]
        switch members["data"] {
        case nil, .null?:
            data = [:]
        case .object(let fields)?:
            data = try Self.checkedData(fields)
        default:
            throw Invalid("data is not an object of strings")
        }
        let category = try Self.optionalString(members["category"], "category", maximum: Self.maximumIDLength)
        let token = try Self.optionalString(members["token"], "token", maximum: Self.maximumTokenLength)
        var timeToLive: Int?
        switch members["time_to_live"] {
        case nil, .null?: break
        case .number(let number)?:
            guard let seconds = number.int64Value, (0...2_419_200).contains(seconds) else {
                throw Invalid("time_to_live must be whole seconds from 0 to 2419200 (28 days)")
            }
            timeToLive = Int(seconds)
        default: throw Invalid("time_to_live is not a number")
        }
        self.init(messageID: id, data: data, category: category, token: token, timeToLive: timeToLive, dataJSON: sentData)
    }

    /// The quick read's message: the members it found, checked as the full read checks
    /// them, in the same order.
    private init(quickID id: String, fields: [String: JSONValue], category: String?, token: String?, dataJSON: String?) throws(Invalid) {
        try Self.checkID(id)
        let data = try Self.checkedData(fields)
        let category = try Self.optionalString(category.map(JSONValue.string), "category", maximum: Self.maximumIDLength)
        let token = try Self.optionalString(token.map(JSONValue.string), "token", maximum: Self.maximumTokenLength)
        self.init(messageID: id, data: data, category: category, token: token, timeToLive: nil, dataJSON: dataJSON)
    }

    private init(messageID: String, data: [String: String], category: String?, token: String?, timeToLive: Int?, dataJSON sentData: String?) {
        self.messageID = messageID
        self.data = data
        self.category = category
        self.token = token
        self.timeToLive = timeToLive
        if let sentData {
            self.dataJSON = sentData
            return
        }
        var dataJSON = "{"
        for (key, value) in data {
            if dataJSON.utf8.count > 1 { dataJSON += "," }
            JSONValue.appendQuoted(key, to: &dataJSON)
            dataJSON += ":"
            JSONValue.appendQuoted(value, to: &dataJSON)
        }
        self.dataJSON = dataJSON + "}"
    }

    private static func checkID(_ id: String) throws(Invalid) {
        guard id.utf8.count <= maximumIDLength, !id.utf8.contains(0) else {
            throw Invalid("message_id is over \(maximumIDLength) bytes or holds U+0000")
        }
    }

    /// What is wrong with the first of `fields` (in name order) that is not a string or holds U+0000.
    private static func firstProblem(in fields: [String: JSONValue]) -> Invalid {
        for key in fields.keys.sorted() {
            guard case .string(let text) = fields[key]! else { return Invalid("data.\(key.prefix(64)) is not a string (data is a map of strings)") }
            if key.utf8.contains(0) || text.utf8.contains(0) { return Invalid("data.\(key.prefix(64)) holds U+0000") }
        }
        return Invalid("data is not an object of strings")
    }

    /// `data`'s members as strings, within FCM's upstream limit.
    private static func checkedData(_ fields: [String: JSONValue]) throws(Invalid) -> [String: String] {
        var data: [String: String] = [:]
        data.reserveCapacity(fields.count)
        var bytes = 0
        for (key, value) in fields {
            guard case .string(let text) = value, !key.utf8.contains(0), !text.utf8.contains(0) else {
                // Named alike whatever the table's order: the first wrong member by name.
                throw firstProblem(in: fields)
            }
            data[key] = text
            bytes += key.utf8.count + text.utf8.count
        }
        guard bytes <= maximumDataBytes else {
            throw Invalid("data is \(bytes) bytes, over FCM's upstream limit of \(maximumDataBytes)", tooLarge: true)
        }
        return data
    }

    private static func optionalString(_ value: JSONValue?, _ name: String, maximum: Int) throws(Invalid) -> String? {
        switch value {
        case nil, .null?: return nil
        case .string(let text)?:
            guard !text.isEmpty, text.utf8.count <= maximum, !text.utf8.contains(0) else {
                throw Invalid("\(name) must be a non-empty string of at most \(maximum) bytes")
            }
            return text
        default: throw Invalid("\(name) is not a string")
        }
    }

    /// A body: one message object, or (`batch`) `{"messages": [...]}` with 1 to 100. Each
    /// message of a batch is read on its own (an invalid one does not refuse the others).
    /// Refused whole: a body that is not UTF-8 (never repaired: two ids that differ only in
    /// their invalid bytes would become one), not JSON, or naming a member twice anywhere.
    /// - Throws: `Invalid` when the body as a whole cannot be read.
    public static func parse(body: [UInt8], batch: Bool) throws(Invalid) -> [Result<IngressMessage, Invalid>] {
        guard let text = String(validating: body, as: UTF8.self) else { throw Invalid("the body is not valid UTF-8") }
        if !batch, let message = try quickly(text, body: body) { return [.success(message)] }
        let value = try readWhole(text)
        guard batch else {
            return [.success(try IngressMessage(value))]
        }
        guard case .array(let items)? = value["messages"] else { throw Invalid("a batch is {\"messages\": [...]}") }
        guard !items.isEmpty, items.count <= maximumBatch else {
            throw Invalid("a batch holds 1 to \(maximumBatch) messages, this one \(items.count)", tooLarge: items.count > maximumBatch)
        }
        return items.map { item in Result { () throws(Invalid) in try IngressMessage(item) } }
    }

    /// The full read of a body's JSON (refusing a member named twice): what the quick read
    /// must agree with.
    package static func readWhole(_ text: String) throws(Invalid) -> JSONValue {
        do {
            return try JSONParser.parseRefusingRepeatedNames(text)
        } catch {
            throw Invalid(error.message.hasSuffix("named twice") ? "the body is not JSON: \(error.message)" : "the body is not JSON")
        }
    }

    /// The top-level members a single message's quick read keeps, in this order.
    private static let quickMembers = JSONParser.Keys(["message_id", "category", "token"])
    /// Member names as they appear quoted in a body: one there that the quick read did not
    /// keep sends the body to the full read.
    private static let quotedTimeToLive = Array(#""time_to_live""#.utf8)
    private static let quotedCategory = Array(#""category""#.utf8)
    private static let quotedToken = Array(#""token""#.utf8)

    /// A single message read the quick way, when its shape allows: the body checked in full
    /// but only its string members and `data` built (a message is read per request, and
    /// building every value cost as much as the rest of its checks). Nil when a member this
    /// way cannot judge is there (`time_to_live`, or a named member that is not a string,
    /// which the full read words a refusal for); the caller reads it in full then.
    /// `dataJSON` is `data` as the device sent it.
    private static func quickly(_ text: String, body: [UInt8]) throws(Invalid) -> IngressMessage? {
        guard let skim = try? JSONParser.skim(text, keeping: quickMembers, recording: "data"), skim.isObject, !skim.repeatsKeptMember,
              let id = skim.strings[0], !id.isEmpty else { return nil }
        let category = skim.strings[1], token = skim.strings[2]
        func mentions(_ quoted: [UInt8]) -> Bool {
            body.withUnsafeBufferPointer { $0.firstOffset(ofBytes: quoted) != nil }
        }
        if mentions(quotedTimeToLive) || (category == nil && mentions(quotedCategory)) || (token == nil && mentions(quotedToken)) { return nil }
        var fields: [String: JSONValue] = [:]
        if let data = skim.memberText, data != "null" {
            // A repeated name inside data: the full read words the refusal.
            guard skim.memberIsObject, case .object(let members)? = try? JSONParser.parseRefusingRepeatedNames(data) else { return nil }
            fields = members
        }
        // Kept as sent unless padded past what its members need (whitespace, escapes): what
        // waits in the queues is bounded by the 4 KB limit, not by the body's.
        let sent = skim.memberIsObject ? skim.memberText : nil
        return try IngressMessage(quickID: id, fields: fields, category: category, token: token,
                                  dataJSON: sent.flatMap { $0.utf8.count <= maximumSentDataBytes ? $0 : nil })
    }

    public struct Invalid: Error, Sendable, Equatable, CustomStringConvertible {
        public let description: String
        /// Over a size limit (413 for a whole body).
        public let tooLarge: Bool
        public init(_ description: String, tooLarge: Bool = false) {
            self.description = description
            self.tooLarge = tooLarge
        }
    }
}
