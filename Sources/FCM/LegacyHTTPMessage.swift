import Foundation

/// A message for FCM's legacy HTTP protocol (`POST /fcm/send`, docs/protocol.md section 8): what
/// XMPP cannot do, a multicast to up to 1,000 registration tokens, and the same targets
/// and options as a downstream XMPP message.
///
/// `validate()` refuses what FCM would answer with 400 (or a per-token error that the
/// message itself causes), naming the field. `jsonBody` is the JSON request;
/// `formBody` the plain-text one, for a single token and string data only.
public struct LegacyHTTPMessage: Sendable, Equatable {
    public enum Target: Sendable, Equatable {
        /// A registration token, a notification key or `/topics/NAME`.
        case to(String)
        /// 1 to 1,000 registration tokens (JSON only).
        case registrationIDs([String])
        /// A topic condition.
        case condition(String)
        /// A device group's notification key (deprecated by FCM: prefer `to`).
        case notificationKey(String)
    }

    /// The most tokens one request may carry.
    public static let maximumRegistrationIDs = 1000

    public var target: Target
    /// Options, `data` and `notification`, as for XMPP (`to`, `condition`, `message_id`
    /// and `delivery_receipt_requested` of this value are not used: HTTP has no receipts).
    public var options: DownstreamMessage
    /// Android: only deliver to apps with this package name.
    public var restrictedPackageName: String?

    public init(target: Target, data: [String: JSONValue]? = nil) {
        self.target = target
        self.options = DownstreamMessage(messageID: "-", data: data)
    }

    /// Checks the rules of sections 3 and 8.
    /// - Throws: `DownstreamValidationError` naming the first offending field.
    public func validate() throws(DownstreamValidationError) {
        var probe = options
        probe.messageID = "http"
        probe.to = nil
        probe.condition = nil
        switch target {
        case .to(let token), .notificationKey(let token):
            probe.to = token
        case .condition(let expression):
            probe.condition = expression
        case .registrationIDs(let tokens):
            guard (1...Self.maximumRegistrationIDs).contains(tokens.count) else {
                throw .init("registration_ids", "must hold 1 to \(Self.maximumRegistrationIDs) tokens, not \(tokens.count)")
            }
            if let bad = tokens.firstIndex(where: { $0.isEmpty || $0.hasPrefix("/topics/") || DownstreamMessage.containsWhitespace($0) }) {
                throw .init("registration_ids[\(bad)]", "is not a registration token")
            }
            guard Set(tokens).count == tokens.count else { throw .init("registration_ids", "lists a token twice") }
            probe.to = tokens[0]
        }
        do {
            try probe.validate()
        } catch {
            // Name the target field of this protocol, not XMPP's `to`.
            if error.field == "to", case .notificationKey = target { throw .init("notification_key", error.reason) }
            throw error
        }
        if options.deliveryReceiptRequested == true {
            throw .init("delivery_receipt_requested", "is XMPP only: the HTTP protocol sends no receipts")
        }
        if let restrictedPackageName, restrictedPackageName.isEmpty { throw .init("restricted_package_name", "is empty") }
    }

    /// The JSON request body.
    public var jsonBody: String {
        guard case .object(var members) = options.json else { return "{}" }
        members["message_id"] = nil
        members["delivery_receipt_requested"] = nil
        members["to"] = nil
        members["condition"] = nil
        switch target {
        case .to(let token): members["to"] = .string(token)
        case .registrationIDs(let tokens): members["registration_ids"] = .array(tokens.map(JSONValue.string))
        case .condition(let expression): members["condition"] = .string(expression)
        case .notificationKey(let key): members["notification_key"] = .string(key)
        }
        if let restrictedPackageName { members["restricted_package_name"] = .string(restrictedPackageName) }
        return JSONValue.object(members).serialized
    }

    /// The plain-text (`application/x-www-form-urlencoded`) body: one token, string data.
    /// - Throws: `DownstreamValidationError` for what the plain-text form cannot carry.
    public func formBody() throws(DownstreamValidationError) -> String {
        guard case .to(let token) = target, !token.hasPrefix("/topics/") else {
            throw .init("registration_id", "the plain-text form takes exactly one registration token")
        }
        guard options.notification == nil else { throw .init("notification", "is JSON only") }
        var fields: [(String, String)] = [("registration_id", token)]
        if let collapseKey = options.collapseKey { fields.append(("collapse_key", collapseKey)) }
        if let timeToLive = options.timeToLive { fields.append(("time_to_live", String(timeToLive))) }
        if let restrictedPackageName { fields.append(("restricted_package_name", restrictedPackageName)) }
        if options.dryRun == true { fields.append(("dry_run", "1")) }
        for (key, value) in (options.data ?? [:]).sorted(by: { $0.key < $1.key }) {
            guard let text = value.stringValue else { throw .init("data.\(key)", "the plain-text form carries strings only") }
            fields.append(("data.\(key)", text))
        }
        return fields.map { "\(Self.formEncode($0.0))=\(Self.formEncode($0.1))" }.joined(separator: "&")
    }

    /// `application/x-www-form-urlencoded` escaping.
    public static func formEncode(_ text: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._*")
        return (text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text).replacingOccurrences(of: "%20", with: "+")
    }
}
