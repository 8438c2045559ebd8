import FCM
import Foundation

/// An upstream message from a device, as handlers see it (docs/protocol.md section 5).
///
/// A value type over one shared, immutable object (`CCSUpstreamMessage`, made on the
/// connection's thread as a message from CCS was decoded): the pipeline copies each
/// message several times on its way to the handlers, and a copy costs one reference count.
public struct UpstreamMessage: Sendable {
    private let storage: CCSUpstreamMessage

    /// CCS's id for the message: unique, and the key of exactly-once handling.
    public var messageID: String { storage.messageID }
    /// The sending device's registration token (the address to reply to).
    public var from: String { storage.from }
    /// The app's package name, as CCS reports it.
    public var category: String? { storage.category }
    /// `data` with every value as a string (non-string JSON values as their JSON text).
    public var data: [String: String] { storage.dataStrings }
    /// `data` with its values as sent.
    public var rawData: [String: JSONValue] { storage.data }
    /// `data` as JSON text exactly as the device sent it (numbers to every digit, members
    /// in their order): what to store in a `jsonb` column.
    public var dataJSON: String { storage.dataJSON }

    /// `data` decoded as `type` (through `JSONDecoder`, from `dataJSON`: dates as ISO 8601).
    /// Device SDKs send every data value as a string: declare `String` properties for those
    /// (numbers and booleans only where the device sent JSON ones).
    /// - Throws: `PermanentFailure` (code `invalid_data`) saying which field does not fit:
    ///   thrown on from a handler, it dead-letters the message at once.
    public func decodeData<T: Decodable>(_ type: T.Type = T.self) throws(PermanentFailure) -> T {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        do {
            return try decoder.decode(type, from: Data(dataJSON.utf8))
        } catch let error as DecodingError {
            throw PermanentFailure("data does not fit \(T.self): \(Self.describe(error))", code: "invalid_data")
        } catch {
            throw PermanentFailure("data does not fit \(T.self): \(error)", code: "invalid_data")
        }
    }

    /// A decoding error in one line: what was wrong, and where.
    private static func describe(_ error: DecodingError) -> String {
        func path(_ keys: [any CodingKey]) -> String {
            keys.isEmpty ? "data" : "data." + keys.map { $0.intValue.map(String.init) ?? $0.stringValue }.joined(separator: ".")
        }
        switch error {
        case .keyNotFound(let key, let context): return "\(path(context.codingPath + [key])) is missing"
        case .typeMismatch(let type, let context): return "\(path(context.codingPath)) is not \(type)"
        case .valueNotFound(let type, let context): return "\(path(context.codingPath)) is null, expected \(type)"
        case .dataCorrupted(let context): return "\(path(context.codingPath)): \(context.debugDescription)"
        @unknown default: return "\(error)"
        }
    }
    /// The whole JSON object, including fields the worker does not use.
    public var raw: JSONValue { storage.raw }
    /// The JSON text exactly as received.
    public var rawPayload: String { storage.json }
    /// The connection it came in on (`ccs#1`, …; `https` over the HTTPS ingress; `spool`
    /// when replayed from the spool).
    public var connection: String { storage.connection }

    /// Who posted it over the HTTPS ingress, as their tokens proved (nil for a message from
    /// CCS). Its `messageID` is then the ingress's (`https:<sender>:<id>`, unique across
    /// senders) and `clientMessageID` the id the device chose.
    public var ingress: IngressOrigin? {
        guard IngressMessageID.senderPrefix(of: messageID) != nil, case .object(let origin)? = raw["ingress"],
              case .string(let clientID)? = origin["message_id"] else { return nil }
        return IngressOrigin(clientMessageID: clientID, uid: origin["uid"]?.stringValue, appID: origin["app_id"]?.stringValue)
    }
    /// When the worker parsed it.
    public var receivedAt: Date { storage.receivedAt }

    /// `dataJSON` is the text `rawData` was parsed from; without it `rawData` is serialised.
    public init(messageID: String, from: String, category: String?, rawData: [String: JSONValue], dataJSON: String? = nil,
                raw: JSONValue, rawPayload: String, connection: String, receivedAt: Date) {
        storage = CCSUpstreamMessage(messageID: messageID, from: from, category: category,
                                     dataJSON: dataJSON ?? JSONValue.object(rawData).serialized, json: rawPayload,
                                     connection: connection, receivedAt: receivedAt, data: rawData, raw: raw)
    }

    /// A message as a device would send it, for tests and replays: its CCS payload is made
    /// from these fields (`message_id` generated when nil).
    public init(from: String, data: [String: JSONValue] = [:], category: String? = "com.example.app",
                messageID: String? = nil, connection: String = "test", receivedAt: Date = Date()) {
        let id = messageID ?? "test-" + UUID().uuidString.lowercased()
        var members: [String: JSONValue] = ["from": .string(from), "message_id": .string(id), "data": .object(data)]
        if let category { members["category"] = .string(category) }
        let raw = JSONValue.object(members)
        self.init(messageID: id, from: from, category: category, rawData: data, raw: raw, rawPayload: raw.serialized,
                  connection: connection, receivedAt: receivedAt)
    }

    /// The message a connection's thread decoded (its `data` and whole JSON parsed when
    /// first asked for).
    package init(_ received: CCSUpstreamMessage) {
        storage = received
    }
}
