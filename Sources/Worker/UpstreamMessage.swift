import FCM
import Foundation
import Synchronization

/// An upstream message from a device, as handlers see it (docs/protocol.md section 5).
///
/// A value type whose fields live in one shared, immutable box: the pipeline copies each
/// message several times on its way to the handlers, and a copy costs one reference count.
public struct UpstreamMessage: Sendable {
    private final class Storage: Sendable {
        let messageID: String
        let from: String
        let category: String?
        let dataJSON: String
        let rawPayload: String
        let connection: String
        let receivedAt: Date
        /// `rawData` and `raw`: given, or parsed on first use from `dataJSON` and
        /// `rawPayload` (the `store` handler needs neither, so a queued message holds
        /// only its text). `Mutex` rather than the project's `BlockingLock`: its state is
        /// stored inline, so the three cells cost no allocation per message, and they are
        /// never contended (one handler reads a message at a time).
        let parsedData: Mutex<[String: JSONValue]?>
        let parsedRaw: Mutex<JSONValue?>
        /// `data`, made on first use.
        let stringData = Mutex<[String: String]?>(nil)

        init(messageID: String, from: String, category: String?, rawData: [String: JSONValue]?, dataJSON: String,
             raw: JSONValue?, rawPayload: String, connection: String, receivedAt: Date) {
            self.messageID = messageID
            self.from = from
            self.category = category
            self.parsedData = Mutex(rawData)
            self.dataJSON = dataJSON
            self.parsedRaw = Mutex(raw)
            self.rawPayload = rawPayload
            self.connection = connection
            self.receivedAt = receivedAt
        }
    }

    private let storage: Storage

    /// CCS's id for the message: unique, and the key of exactly-once handling.
    public var messageID: String { storage.messageID }
    /// The sending device's registration token (the address to reply to).
    public var from: String { storage.from }
    /// The app's package name, as CCS reports it.
    public var category: String? { storage.category }
    /// `data` with every value as a string (non-string JSON values as their JSON text).
    public var data: [String: String] {
        Self.memo(storage.stringData) {
            rawData.mapValues { value in
                if case .string(let text) = value { return text }
                return value.serialized
            }
        }
    }
    /// `data` with its values as sent.
    public var rawData: [String: JSONValue] {
        Self.memo(storage.parsedData) { (try? JSONValue.parse(storage.dataJSON))?.objectValue ?? [:] }
    }
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
    public var raw: JSONValue {
        Self.memo(storage.parsedRaw) { (try? JSONValue.parse(storage.rawPayload)) ?? .object([:]) }
    }
    /// The JSON text exactly as received.
    public var rawPayload: String { storage.rawPayload }
    /// The connection it came in on (`ccs#1`, …; `spool` when replayed from the spool).
    public var connection: String { storage.connection }
    /// When the worker parsed it.
    public var receivedAt: Date { storage.receivedAt }

    /// The value in `cell`, made by `make` and kept there the first time.
    private static func memo<Value>(_ cell: borrowing Mutex<Value?>, _ make: () -> Value) -> Value {
        cell.withLock { cached in
            if let cached { return cached }
            let made = make()
            cached = made
            return made
        }
    }

    /// `dataJSON` is the text `rawData` was parsed from; without it `rawData` is serialised.
    public init(messageID: String, from: String, category: String?, rawData: [String: JSONValue], dataJSON: String? = nil,
                raw: JSONValue, rawPayload: String, connection: String, receivedAt: Date) {
        storage = Storage(messageID: messageID, from: from, category: category, rawData: rawData,
                          dataJSON: dataJSON ?? JSONValue.object(rawData).serialized, raw: raw,
                          rawPayload: rawPayload, connection: connection, receivedAt: receivedAt)
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

    /// A message as CCS sent it: `rawData` and `raw` are parsed from `upstream`'s text when
    /// first asked for. `upstream` has a `message_id` and a `from`.
    init(_ upstream: CCSMessage.Upstream, messageID: String, from: String, connection: String, receivedAt: Date) {
        storage = Storage(messageID: messageID, from: from, category: upstream.category, rawData: nil,
                          dataJSON: upstream.dataJSON, raw: nil, rawPayload: upstream.json,
                          connection: connection, receivedAt: receivedAt)
    }
}
