import FCM

/// A downstream message a handler queues (`HandlerContext.send`): its target, payload and
/// options, and the transport that carries it. It becomes an outbox row in the handler's
/// transaction and goes out once that commits.
public struct OutgoingMessage: Sendable, Equatable {
    /// Where it goes.
    public enum Target: Sendable, Equatable {
        /// A registration token, a device group's notification key, or `/topics/NAME`.
        case to(String)
        /// A topic condition such as `'news' in topics && 'sport' in topics`.
        case condition(String)
        /// Up to 1,000 registration tokens in one request: legacy HTTP only (XMPP has no
        /// multicast), each token's answer kept in the row's `token_results`.
        case multicast([String])
    }

    /// Which FCM protocol carries it.
    public enum Transport: String, Sendable, Equatable {
        /// CCS, over the worker's connections: delivery receipts, 100 pending per connection.
        case xmpp
        /// Legacy HTTP: multicast, and answers per token.
        case http
        /// FCM's HTTP v1 API (the one FCM serves today), with a service account: a multicast
        /// goes out as one request per token.
        case v1
    }

    public var target: Target
    /// The app's key-value payload (`data`), at most 4 KB with `notification`.
    public var data: [String: JSONValue]
    /// FCM's fields beside `data`: `notification`, `time_to_live`, `priority`,
    /// `collapse_key`, `content_available`, `mutable_content`, `dry_run`,
    /// `delivery_receipt_requested`.
    public var options: [String: JSONValue]
    /// The transport; nil for the outbox's default (the `transport` column's default:
    /// `xmpp`, unless `fcm-worker outbox default-transport` changed it). A `.multicast`
    /// goes over `.http` unless `.v1` is set.
    public var transport: Transport?
    /// The upstream message it answers (the outbox row's `source_message_id`).
    public var sourceMessageID: String?

    public init(_ target: Target, data: [String: JSONValue] = [:], options: [String: JSONValue] = [:],
                transport: Transport? = nil, sourceMessageID: String? = nil) {
        self.target = target
        self.data = data
        self.options = options
        self.transport = transport
        self.sourceMessageID = sourceMessageID
    }

    /// The row's `payload`: the options with `data`.
    public var payload: JSONValue {
        var payload = options
        payload["data"] = .object(data)
        return .object(payload)
    }

    /// The transport the row gets: HTTP for a multicast not set to v1. A message that names
    /// none gets the outbox's default: this says what that is while the default is XMPP (as
    /// it is unless `fcm-worker outbox default-transport` changed it).
    public var effectiveTransport: Transport {
        if case .multicast = target, transport != .v1 { return .http }
        return transport ?? .xmpp
    }

    /// Checks it against FCM's rules, as the outbox would before sending it (a message that
    /// fails here would be marked failed with `INVALID_MESSAGE` instead).
    /// - Throws: `DownstreamValidationError` naming the offending field.
    public func validate() throws(DownstreamValidationError) {
        let message: DownstreamMessage
        switch target {
        case .to(let token):
            message = try DownstreamMessage(target: token, condition: nil, payload: payload, messageID: "check")
        case .condition(let expression):
            message = try DownstreamMessage(target: nil, condition: expression, payload: payload, messageID: "check")
        case .multicast(let tokens):
            guard (1...LegacyHTTPMessage.maximumRegistrationIDs).contains(tokens.count) else {
                throw DownstreamValidationError("registration_ids", "holds \(tokens.count) tokens: 1 to \(LegacyHTTPMessage.maximumRegistrationIDs) are allowed")
            }
            for token in tokens where token.isEmpty || token.contains(where: \.isWhitespace) {
                throw DownstreamValidationError("registration_ids", "a token is empty or holds whitespace")
            }
            message = try DownstreamMessage(target: tokens[0], condition: nil, payload: payload, messageID: "check")
        }
        // A v1 send is checked by v1's rule for data keys (an option's name is an ordinary key there).
        try message.validate(dataKeys: effectiveTransport == .v1 ? .v1 : .legacy)
        if effectiveTransport == .http, options["delivery_receipt_requested"] == .bool(true) {
            throw DownstreamValidationError("delivery_receipt_requested", "is an XMPP option: legacy HTTP has no delivery receipts")
        }
        if effectiveTransport == .v1 {
            // What the v1 transport would refuse (an option it cannot carry) is refused now.
            switch target {
            case .to(let token): _ = try FCMV1Message.requests(target: token, condition: nil, registrationIDs: nil, payload: payload)
            case .condition(let expression): _ = try FCMV1Message.requests(target: nil, condition: expression, registrationIDs: nil, payload: payload)
            case .multicast(let tokens): _ = try FCMV1Message.requests(target: nil, condition: nil, registrationIDs: tokens, payload: payload)
            }
        }
    }
}
