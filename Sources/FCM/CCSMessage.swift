import XMPP

/// A JSON message CCS sends the app server inside `<gcm xmlns="google:mobile:data">`,
/// classified by `message_type` (PROTOCOL.md sections 4 to 7).
public enum CCSMessage: Sendable, Equatable {
    /// A device's upstream message (no `message_type`).
    case upstream(Upstream)
    /// A delivery receipt (`message_type: receipt`); ack it like an upstream message.
    case receipt(Upstream)
    /// CCS accepted a downstream message.
    case ack(messageID: String, from: String?, canonicalRegistrationID: String?)
    /// CCS refused a downstream message.
    case nack(messageID: String, from: String?, error: String, description: String?, canonicalRegistrationID: String?)
    /// A control message such as `CONNECTION_DRAINING`.
    case control(type: String)

    /// The fields of an upstream message or receipt.
    public struct Upstream: Sendable, Equatable {
        /// Nil when CCS sent none: such a message cannot be acked.
        public var messageID: String?
        /// The sender's registration token (`gcm.googleapis.com` for receipts).
        public var from: String?
        public var category: String?
        public var data: [String: JSONValue]
        /// `data` exactly as received (`{}` when absent): what the `store` handler keeps,
        /// with numbers to every digit and members in their order.
        public var dataJSON: String
        /// The whole JSON object as received.
        public var raw: JSONValue
    }

    /// Why a `<gcm>` payload could not be understood.
    public enum DecodingError: Error, Equatable, Sendable, CustomStringConvertible {
        case notJSON(String)
        case notAnObject
        case missingField(String, messageType: String)
        case unknownMessageType(String)

        public var description: String {
            switch self {
            case .notJSON(let detail): "the <gcm> payload is not JSON: \(detail)"
            case .notAnObject: "the <gcm> payload is not a JSON object"
            case .missingField(let field, let type): "a \(type) message lacks \(field)"
            case .unknownMessageType(let type): "unknown message_type \(type)"
            }
        }
    }

    /// Classifies the JSON text of a `<gcm>` element.
    public static func decode(json text: String) throws(DecodingError) -> CCSMessage {
        let value: JSONValue, dataText: String?
        do {
            (value, dataText) = try JSONParser.parse(text, recording: "data")
        } catch {
            throw .notJSON(String(describing: error).prefix(200).description)
        }
        guard case .object(let members) = value else { throw .notAnObject }
        let messageType = members["message_type"]?.stringValue
        func upstream() -> Upstream {
            let data = members["data"]?.objectValue
            return Upstream(messageID: members["message_id"]?.stringValue, from: members["from"]?.stringValue,
                            category: members["category"]?.stringValue, data: data ?? [:],
                            dataJSON: data == nil ? "{}" : dataText ?? "{}", raw: value)
        }
        switch messageType {
        case nil: return .upstream(upstream())
        case "receipt": return .receipt(upstream())
        case "ack", "nack":
            guard let messageID = members["message_id"]?.stringValue else {
                throw .missingField("message_id", messageType: messageType!)
            }
            let from = members["from"]?.stringValue
            let canonical = members["registration_id"]?.stringValue
            if messageType == "ack" {
                return .ack(messageID: messageID, from: from, canonicalRegistrationID: canonical)
            }
            return .nack(messageID: messageID, from: from, error: members["error"]?.stringValue ?? "UNKNOWN",
                         description: members["error_description"]?.stringValue, canonicalRegistrationID: canonical)
        case "control":
            return .control(type: members["control_type"]?.stringValue ?? "")
        case let other?:
            throw .unknownMessageType(other)
        }
    }
}
