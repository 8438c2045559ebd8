import Foundation
import Synchronization

/// A device's upstream message with its `message_id` and `from`, as the connection's thread
/// decoded it: one immutable object, made there and shared by reference up to the handlers
/// (the worker's `UpstreamMessage` is a view of it). Handing it on costs one reference
/// count, not one per field, and it is one allocation, not two (the decoded fields, then
/// a copy of them for the handlers). `data` and the whole JSON are parsed on first use and
/// kept.
public final class CCSUpstreamMessage: Sendable {
    /// CCS's id for the message.
    public let messageID: String
    /// The sending device's registration token.
    public let from: String
    /// The app's package name, as CCS reports it.
    public let category: String?
    /// `data` exactly as received (`{}` when absent): numbers to every digit, members in
    /// their order.
    public let dataJSON: String
    /// The whole JSON text as received (a message that arrived otherwise than as JSON, as
    /// one posted to the HTTPS ingress, has it made on first use: storing a message needs
    /// it only when it is spooled or dead-lettered).
    public var json: String {
        Self.memo(jsonText) { makeJSON?() ?? "{}" }
    }
    /// The label of the connection it came in on.
    public let connection: String
    /// When it was parsed.
    public let receivedAt: Date

    /// `data` and the whole JSON, parsed: given, or parsed on first use from `dataJSON` and
    /// `json` (storing a message needs neither, so most are never parsed). `Mutex` rather
    /// than the project's `BlockingLock`: its state is stored inline, so the cells cost no
    /// allocation per message, and they are never contended (one handler reads a message
    /// at a time).
    private let parsedData: Mutex<[String: JSONValue]?>
    private let parsedJSON: Mutex<JSONValue?>
    /// `dataStrings`, made on first use.
    private let stringData = Mutex<[String: String]?>(nil)
    /// `json`: given, or made by `makeJSON` on first use.
    private let jsonText: Mutex<String?>
    private let makeJSON: (@Sendable () -> String)?

    /// `data` and `raw`, when given, are what `dataJSON` and `json` hold, parsed.
    public init(messageID: String, from: String, category: String?, dataJSON: String, json: String, connection: String,
                receivedAt: Date, data: [String: JSONValue]? = nil, raw: JSONValue? = nil) {
        self.messageID = messageID
        self.from = from
        self.category = category
        self.dataJSON = dataJSON
        self.jsonText = Mutex(json)
        self.makeJSON = nil
        self.connection = connection
        self.receivedAt = receivedAt
        self.parsedData = Mutex(data)
        self.parsedJSON = Mutex(raw)
    }

    /// A message whose whole JSON text `makeJSON` makes when it is first asked for (once).
    public init(messageID: String, from: String, category: String?, dataJSON: String, connection: String, receivedAt: Date,
                makeJSON: @escaping @Sendable () -> String) {
        self.messageID = messageID
        self.from = from
        self.category = category
        self.dataJSON = dataJSON
        self.jsonText = Mutex(nil)
        self.makeJSON = makeJSON
        self.connection = connection
        self.receivedAt = receivedAt
        self.parsedData = Mutex(nil)
        self.parsedJSON = Mutex(nil)
    }

    /// `upstream`'s fields, when it has a `message_id` and a `from`.
    public convenience init?(_ upstream: CCSMessage.Upstream, connection: String, receivedAt: Date) {
        guard let messageID = upstream.messageID, let from = upstream.from else { return nil }
        self.init(messageID: messageID, from: from, category: upstream.category, dataJSON: upstream.dataJSON, json: upstream.json,
                  connection: connection, receivedAt: receivedAt)
    }

    /// `data` with its values as sent (empty when `dataJSON` is not an object).
    public var data: [String: JSONValue] {
        Self.memo(parsedData) { (try? JSONParser.parse(dataJSON))?.objectValue ?? [:] }
    }

    /// `data` with every value as a string (non-string JSON values as their JSON text).
    public var dataStrings: [String: String] {
        Self.memo(stringData) {
            data.mapValues { value in
                if case .string(let text) = value { return text }
                return value.serialized
            }
        }
    }

    /// The whole JSON object (an empty object when `json` does not parse).
    public var raw: JSONValue {
        Self.memo(parsedJSON) { (try? JSONParser.parse(json)) ?? .object([:]) }
    }

    /// The value in `cell`, made by `make` and kept there the first time.
    private static func memo<Value>(_ cell: borrowing Mutex<Value?>, _ make: () -> Value) -> Value {
        cell.withLock { cached in
            if let cached { return cached }
            let made = make()
            cached = made
            return made
        }
    }
}
