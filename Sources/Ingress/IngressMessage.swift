import FCM
import Foundation

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
        guard id.utf8.count <= Self.maximumIDLength, !id.utf8.contains(0) else {
            throw Invalid("message_id is over \(Self.maximumIDLength) bytes or holds U+0000")
        }
        var data: [String: String] = [:]
        var bytes = 0
        switch members["data"] {
        case nil, .null?:
            break
        case .object(let fields)?:
            for (key, value) in fields {
                guard case .string(let text) = value else { throw Invalid("data.\(key.prefix(64)) is not a string (data is a map of strings)") }
                guard !key.utf8.contains(0), !text.utf8.contains(0) else { throw Invalid("data.\(key.prefix(64)) holds U+0000") }
                data[key] = text
                bytes += key.utf8.count + text.utf8.count
            }
        default:
            throw Invalid("data is not an object of strings")
        }
        guard bytes <= Self.maximumDataBytes else {
            throw Invalid("data is \(bytes) bytes, over FCM's upstream limit of \(Self.maximumDataBytes)", tooLarge: true)
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
        self.messageID = id
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
    /// - Throws: `Invalid` when the body as a whole cannot be read.
    public static func parse(body: [UInt8], batch: Bool) throws(Invalid) -> [Result<IngressMessage, Invalid>] {
        let text = String(decoding: body, as: UTF8.self)
        if !batch, let message = try quickly(text, body: body) { return [.success(message)] }
        guard let value = try? JSONValue.parse(text) else { throw Invalid("the body is not JSON") }
        guard batch else {
            return [.success(try IngressMessage(value))]
        }
        guard case .array(let items)? = value["messages"] else { throw Invalid("a batch is {\"messages\": [...]}") }
        guard !items.isEmpty, items.count <= maximumBatch else {
            throw Invalid("a batch holds 1 to \(maximumBatch) messages, this one \(items.count)", tooLarge: items.count > maximumBatch)
        }
        return items.map { item in Result { () throws(Invalid) in try IngressMessage(item) } }
    }

    /// The top-level members a single message's quick read keeps, in this order.
    private static let quickMembers = JSONParser.Keys(["message_id", "category", "token"])

    /// A single message read the quick way, when its shape allows: the body checked in full
    /// but only its string members and `data` built (a message is read per request, and
    /// building every value cost as much as the rest of its checks). Nil when a member this
    /// way cannot judge is there (`time_to_live`, or a named member that is not a string,
    /// which the full read words a refusal for); the caller reads it in full then.
    /// `dataJSON` is `data` as the device sent it.
    private static func quickly(_ text: String, body: [UInt8]) throws(Invalid) -> IngressMessage? {
        guard let skim = try? JSONParser.skim(text, keeping: quickMembers, recording: "data"), skim.isObject,
              let id = skim.strings[0], !id.isEmpty else { return nil }
        let category = skim.strings[1], token = skim.strings[2]
        func mentions(_ name: String) -> Bool {
            let quoted = Array("\"\(name)\"".utf8)
            return body.withUnsafeBufferPointer { bytes in
                guard bytes.count >= quoted.count else { return false }
                for start in 0...(bytes.count - quoted.count) where bytes[start] == quoted[0] {
                    if UnsafeBufferPointer(rebasing: bytes[start..<(start + quoted.count)]).elementsEqual(quoted) { return true }
                }
                return false
            }
        }
        if mentions("time_to_live") || (category == nil && mentions("category")) || (token == nil && mentions("token")) { return nil }
        var fields: [String: JSONValue] = [:]
        if let data = skim.memberText, data != "null" {
            guard skim.memberIsObject, case .object(let members)? = try? JSONParser.parse(data) else { return nil }
            fields = members
        }
        var members: [String: JSONValue] = ["message_id": .string(id), "data": .object(fields)]
        if let category { members["category"] = .string(category) }
        if let token { members["token"] = .string(token) }
        return try IngressMessage(.object(members), dataJSON: skim.memberIsObject ? skim.memberText : nil)
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
