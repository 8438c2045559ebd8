import Foundation

/// The client side of an XMPP session as a pure state machine: stream header, SASL PLAIN,
/// stream restart, resource bind, optional session; then the established stream, where it
/// answers server pings and hands every other stanza to the application.
///
/// Feed it `start()` and then every parser event; do what the returned actions say, in order.
public struct SessionNegotiation: Sendable {
    public struct Credentials: Sendable {
        /// The XMPP domain the stream is addressed to (FCM: `gcm.googleapis.com`).
        public var domain: String
        /// The SASL PLAIN authentication identity (FCM: `SENDER_ID@gcm.googleapis.com`).
        public var authenticationIdentity: String
        public var password: String
        /// The resource to ask for when binding; nil lets the server choose.
        public var resource: String?

        public init(domain: String, authenticationIdentity: String, password: String, resource: String? = nil) {
            self.domain = domain
            self.authenticationIdentity = authenticationIdentity
            self.password = password
            self.resource = resource
        }
    }

    public enum State: Sendable, Equatable {
        case idle
        case awaitingStreamHeader(authenticated: Bool)
        case awaitingFeatures(authenticated: Bool)
        case authenticating
        case binding(id: String)
        case startingSession(id: String, jid: String)
        case established(jid: String)
        case ended
    }

    public enum Action: Sendable, Equatable {
        /// Write this text to the stream.
        case send(String)
        /// Start a new XML parser: the server's next bytes open a new stream.
        case restartStream
        /// The session is ready; `jid` is the full JID the server bound.
        case established(jid: String)
        /// An application stanza for the consumer.
        case deliver(XMLElement)
        /// An application stanza too large to keep, read to its end (the stream goes on).
        case deliverOversized(OversizedStanza)
        /// End the connection with this error.
        case fail(XMPPError)
    }

    public private(set) var state: State = .idle
    private let credentials: Credentials
    private var sessionRequired = false
    /// Messages that came between the resource's binding and the session's start, in order
    /// (an oversized one too: it is delivered as such once the session is up).
    private var heldDuringSessionStart: [Action] = []
    private var nextID = 0

    public init(credentials: Credentials) {
        self.credentials = credentials
    }

    /// The stream header that opens (and re-opens) the stream.
    public var streamHeader: String {
        var header = "<?xml version='1.0'?><stream:stream to=\""
        XMLEscaping.appendAttribute(credentials.domain, to: &header)
        header += "\" version=\"1.0\" xmlns=\"jabber:client\" xmlns:stream=\"http://etherx.jabber.org/streams\">"
        return header
    }

    /// Opens the stream.
    public mutating func start() -> [Action] {
        guard state == .idle else { return [] }
        state = .awaitingStreamHeader(authenticated: false)
        return [.send(streamHeader)]
    }

    /// A ping to send after an idle period (XEP-0199).
    public mutating func makePing() -> String {
        nextID += 1
        return "<iq type=\"get\" id=\"ping-\(nextID)\"><ping xmlns=\"urn:xmpp:ping\"/></iq>"
    }

    /// The stanza of `event` when `handle(event)` would be `[.deliver(stanza)]` and change
    /// nothing (an application stanza of an established session: once per message), so
    /// that the reader can deliver it without making that array; nil for anything else.
    public func applicationStanza(_ event: XMLStreamEvent) -> XMLElement? {
        guard case .established = state, case .stanza(let element) = event, element.name != "iq",
              !(element.name == "error" && element.namespace == XMPPNamespace.streams) else { return nil }
        return element
    }

    public mutating func handle(_ event: XMLStreamEvent) -> [Action] {
        if let stanza = applicationStanza(event) { return [.deliver(stanza)] }
        switch event {
        case .streamOpened:
            guard case .awaitingStreamHeader(let authenticated) = state else {
                return fail(.protocolViolation("unexpected stream header"))
            }
            state = .awaitingFeatures(authenticated: authenticated)
            return []
        case .streamClosed:
            state = .ended
            return [.fail(.closedByPeer)]
        case .stanza(let element):
            if element.name == "error" && element.namespace == XMPPNamespace.streams {
                let condition = element.elements.first { $0.namespace == XMPPNamespace.streamErrors && $0.name != "text" }?.name ?? "undefined-condition"
                let text = element.child("text", namespace: XMPPNamespace.streamErrors)?.text
                return fail(.streamError(condition: condition, text: text))
            }
            return handle(stanza: element)
        case .oversizedStanza(let stanza):
            // An oversized message that came once the resource was bound is held with the
            // others and set aside once the session is up (acked when its id can be read,
            // dead-lettered as oversized), so that a poison message queued in CCS never
            // blocks the sender's every connection.
            if case .startingSession = state, stanza.name == "message" {
                heldDuringSessionStart.append(.deliverOversized(stanza))
                return []
            }
            // Any other stanza over the limit during negotiation: the stream cannot go on.
            guard case .established = state, stanza.name != "iq" else {
                return fail(.protocolViolation("a <\(stanza.name)> of \(stanza.byteCount) bytes, over the size limit, before the session was established"))
            }
            return [.deliverOversized(stanza)]
        }
    }

    private mutating func handle(stanza element: XMLElement) -> [Action] {
        switch state {
        case .idle, .awaitingStreamHeader, .ended:
            return fail(.protocolViolation("<\(element.name)> before the stream was opened"))

        case .awaitingFeatures(authenticated: false):
            guard element.name == "features", element.namespace == XMPPNamespace.streams else {
                return fail(.protocolViolation("expected <stream:features>, got <\(element.name)>"))
            }
            let mechanisms = element.child("mechanisms", namespace: XMPPNamespace.sasl)?
                .elements.filter { $0.name == "mechanism" }.map(\.text) ?? []
            guard mechanisms.contains("PLAIN") else {
                return fail(.protocolViolation("the server does not offer SASL PLAIN (offers: \(mechanisms.joined(separator: ", ")))"))
            }
            state = .authenticating
            let token = Data(("\0" + credentials.authenticationIdentity + "\0" + credentials.password).utf8).base64EncodedString()
            return [.send("<auth mechanism=\"PLAIN\" xmlns=\"\(XMPPNamespace.sasl)\">\(token)</auth>")]

        case .authenticating:
            guard element.namespace == XMPPNamespace.sasl else {
                return fail(.protocolViolation("expected a SASL answer, got <\(element.name)>"))
            }
            switch element.name {
            case "success":
                state = .awaitingStreamHeader(authenticated: true)
                return [.restartStream, .send(streamHeader)]
            case "failure":
                let condition = element.elements.first { $0.name != "text" }?.name ?? "not-authorized"
                state = .ended
                return [.fail(.authenticationRefused(condition: condition))]
            default:
                return fail(.protocolViolation("unexpected SASL element <\(element.name)>"))
            }

        case .awaitingFeatures(authenticated: true):
            guard element.name == "features", element.namespace == XMPPNamespace.streams else {
                return fail(.protocolViolation("expected <stream:features> after authentication, got <\(element.name)>"))
            }
            guard element.child("bind", namespace: XMPPNamespace.bind) != nil else {
                return fail(.protocolViolation("the server does not offer resource binding"))
            }
            if let session = element.child("session", namespace: XMPPNamespace.session) {
                sessionRequired = session.child("optional") == nil
            }
            nextID += 1
            let id = "bind-\(nextID)"
            state = .binding(id: id)
            var bind = "<iq type=\"set\" id=\"\(id)\"><bind xmlns=\"\(XMPPNamespace.bind)\""
            if let resource = credentials.resource {
                bind += "><resource>\(XMLEscaping.escapeText(resource))</resource></bind></iq>"
            } else {
                bind += "/></iq>"
            }
            return [.send(bind)]

        case .binding(let id):
            guard element.name == "iq", element.attribute("id") == id else {
                return fail(.protocolViolation("expected the bind result, got <\(element.name)>"))
            }
            guard element.attribute("type") == "result",
                  let jid = element.child("bind", namespace: XMPPNamespace.bind)?.child("jid")?.text, !jid.isEmpty else {
                let condition = element.child("error")?.elements.first?.name ?? "no JID in the result"
                return fail(.protocolViolation("resource binding failed: \(condition)"))
            }
            if sessionRequired {
                nextID += 1
                let sessionID = "session-\(nextID)"
                state = .startingSession(id: sessionID, jid: jid)
                return [.send("<iq type=\"set\" id=\"\(sessionID)\"><session xmlns=\"\(XMPPNamespace.session)\"/></iq>")]
            }
            state = .established(jid: jid)
            return [.established(jid: jid)]

        case .startingSession(let id, let jid):
            // The server may start sending messages as soon as the resource is bound:
            // hold them until the session is established, then deliver them in order.
            if element.name == "message" {
                heldDuringSessionStart.append(.deliver(element))
                return []
            }
            guard element.name == "iq", element.attribute("id") == id else {
                return fail(.protocolViolation("expected the session result, got <\(element.name)>"))
            }
            guard element.attribute("type") == "result" else {
                return fail(.protocolViolation("session establishment failed"))
            }
            state = .established(jid: jid)
            defer { heldDuringSessionStart.removeAll() }
            return [.established(jid: jid)] + heldDuringSessionStart

        case .established:
            guard element.name == "iq" else { return [.deliver(element)] }
            return answer(iq: element)
        }
    }

    /// Answers an iq on an established stream: pings get a result, results of our pings are
    /// taken, any other get/set gets `service-unavailable` as RFC 6120 requires.
    private func answer(iq: XMLElement) -> [Action] {
        let type = iq.attribute("type") ?? ""
        let id = iq.attribute("id") ?? ""
        switch type {
        case "get", "set":
            var reply = "<iq type=\"" + (iq.child("ping", namespace: XMPPNamespace.ping) != nil && type == "get" ? "result" : "error") + "\" id=\""
            XMLEscaping.appendAttribute(id, to: &reply)
            reply += "\""
            if let from = iq.attribute("from") {
                reply += " to=\""
                XMLEscaping.appendAttribute(from, to: &reply)
                reply += "\""
            }
            if iq.child("ping", namespace: XMPPNamespace.ping) != nil && type == "get" {
                reply += "/>"
            } else {
                reply += "><error type=\"cancel\"><service-unavailable xmlns=\"\(XMPPNamespace.stanzas)\"/></error></iq>"
            }
            return [.send(reply)]
        default:
            // Results and errors of our own pings: their arrival already proved liveness.
            if id.hasPrefix("ping-") { return [] }
            return [.deliver(iq)]
        }
    }

    private mutating func fail(_ error: XMPPError) -> [Action] {
        state = .ended
        return [.fail(error)]
    }
}
