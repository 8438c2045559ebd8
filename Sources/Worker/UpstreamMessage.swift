import FCM
import Foundation

/// An upstream message from a device, as handlers see it (PROTOCOL.md section 5).
public struct UpstreamMessage: Sendable {
    /// CCS's id for the message: unique, and the key of exactly-once handling.
    public let messageID: String
    /// The sending device's registration token (the address to reply to).
    public let from: String
    /// The app's package name, as CCS reports it.
    public let category: String?
    /// `data` with every value as a string (non-string JSON values as their JSON text).
    public let data: [String: String]
    /// `data` with its values as sent.
    public let rawData: [String: JSONValue]
    /// The whole JSON object, including fields the worker does not use.
    public let raw: JSONValue
    /// The JSON text exactly as received.
    public let rawPayload: String
    /// The connection it came in on (`ccs#1`, …; `spool` when replayed from the spool).
    public let connection: String
    /// When the worker parsed it.
    public let receivedAt: Date

    public init(messageID: String, from: String, category: String?, rawData: [String: JSONValue],
                raw: JSONValue, rawPayload: String, connection: String, receivedAt: Date) {
        self.messageID = messageID
        self.from = from
        self.category = category
        self.rawData = rawData
        self.data = rawData.mapValues { value in
            if case .string(let text) = value { return text }
            return value.serialized
        }
        self.raw = raw
        self.rawPayload = rawPayload
        self.connection = connection
        self.receivedAt = receivedAt
    }
}
