import XMPP

/// A JSON message CCS sends the app server inside `<gcm xmlns="google:mobile:data">`,
/// classified by `message_type` (docs/protocol.md sections 4 to 7).
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
        /// `data` exactly as received (`{}` when absent): what the `store` handler keeps,
        /// with numbers to every digit and members in their order.
        public var dataJSON: String
        /// The whole JSON text as received.
        public var json: String

        /// `data` with its values parsed (from `dataJSON`, on each access: keep the result).
        public var data: [String: JSONValue] { (try? JSONParser.parse(dataJSON))?.objectValue ?? [:] }
        /// The whole JSON object (parsed from `json`, on each access: keep the result).
        public var raw: JSONValue { (try? JSONParser.parse(json)) ?? .object([:]) }
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

    /// The string members `decode` reads, in the order of `keptMembers`.
    private enum Member: Int, CaseIterable {
        case messageType, messageID, from, category, registrationID, error, errorDescription, controlType

        var name: String {
            switch self {
            case .messageType: "message_type"
            case .messageID: "message_id"
            case .from: "from"
            case .category: "category"
            case .registrationID: "registration_id"
            case .error: "error"
            case .errorDescription: "error_description"
            case .controlType: "control_type"
            }
        }
    }

    private static let keptMembers = JSONParser.Keys(Member.allCases.map(\.name))

    /// `decode`'s view of the kept members.
    private struct KeptMembers {
        let values: JSONParser.KeptStrings
        subscript(member: Member) -> String? { values[member.rawValue] }
    }

    /// The string members that name a message: enough to ack one of an unknown type.
    public struct Identity: Sendable, Equatable {
        public var messageID: String?
        public var from: String?
        public var category: String?
    }

    /// The `message_id`, `from` and `category` of a JSON object text (nil members when the
    /// text is not an object or they are not strings).
    public static func identity(of text: String) -> Identity? {
        guard let skim = try? JSONParser.skim(text, keeping: Self.keptMembers, recording: "data"), skim.isObject else { return nil }
        let members = KeptMembers(values: skim.strings)
        return Identity(messageID: members[.messageID], from: members[.from], category: members[.category])
    }

    /// Classifies the JSON text of a `<gcm>` element.
    public static func decode(json text: String) throws(DecodingError) -> CCSMessage {
        // Checked in full, but only what is needed now is built: the string members and
        // the text of `data`. `data` and `raw` are parsed later by whoever wants them.
        let skim: JSONParser.Skim
        do {
            skim = try JSONParser.skim(text, keeping: Self.keptMembers, recording: "data")
        } catch {
            throw .notJSON(String(describing: error).prefix(200).description)
        }
        guard skim.isObject else { throw .notAnObject }
        let members = KeptMembers(values: skim.strings)
        let messageType = members[.messageType]
        func upstream() -> Upstream {
            Upstream(messageID: members[.messageID], from: members[.from], category: members[.category],
                     dataJSON: skim.memberIsObject ? skim.memberText ?? "{}" : "{}", json: text)
        }
        switch messageType {
        case nil: return .upstream(upstream())
        case "receipt": return .receipt(upstream())
        case "ack", "nack":
            guard let messageID = members[.messageID] else {
                throw .missingField("message_id", messageType: messageType!)
            }
            let from = members[.from]
            let canonical = members[.registrationID]
            if messageType == "ack" {
                return .ack(messageID: messageID, from: from, canonicalRegistrationID: canonical)
            }
            return .nack(messageID: messageID, from: from, error: members[.error] ?? "UNKNOWN",
                         description: members[.errorDescription], canonicalRegistrationID: canonical)
        case "control":
            return .control(type: members[.controlType] ?? "")
        case let other?:
            throw .unknownMessageType(other)
        }
    }
}
