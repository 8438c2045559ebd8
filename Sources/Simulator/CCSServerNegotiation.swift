import Foundation
import XMPP

/// CCS's side of session setup as a pure state machine: answers the client's stream
/// header with features, checks SASL PLAIN credentials, restarts the stream, binds a
/// resource and accepts the optional session, exactly as docs/protocol.md section 2 describes.
struct CCSServerNegotiation {
    enum State: Equatable {
        case awaitingHeader(authenticated: Bool)
        case awaitingAuth
        case awaitingBind
        case established(jid: String)
        case ended
    }

    enum Action: Equatable {
        case send(String)
        case restartStream
        case authenticated(identity: String)
        case refused(reason: String)
        case bound(jid: String)
        /// A stanza of the established stream, for the CCS logic.
        case stanza(XMLElement)
        /// The client broke the protocol; close with this stream error condition.
        case violation(condition: String, detail: String)
        case clientClosed
        case pingAnswered
    }

    private(set) var state: State = .awaitingHeader(authenticated: false)
    let senderID: String
    let serverKey: String
    let domain: String
    /// Domains CCS answered to, as the stream's `to` and after the `@` of the SASL
    /// identity: both `gcm.googleapis.com` and `fcm.googleapis.com` (published clients use
    /// either), and the configured one.
    let acceptedDomains: Set<String>
    private let streamID = UUID().uuidString.prefix(16)

    init(senderID: String, serverKey: String, domain: String) {
        self.senderID = senderID
        self.serverKey = serverKey
        self.domain = domain
        self.acceptedDomains = [domain, "gcm.googleapis.com", "fcm.googleapis.com"]
    }

    private var header: String {
        "<stream:stream from=\"\(domain)\" id=\"\(streamID)\" version=\"1.0\" xmlns:stream=\"http://etherx.jabber.org/streams\" xmlns=\"jabber:client\">"
    }

    mutating func handle(_ event: XMLStreamEvent) -> [Action] {
        switch event {
        case .streamClosed:
            state = .ended
            return [.clientClosed]
        case .streamOpened(let root):
            guard case .awaitingHeader(let authenticated) = state else {
                return violate("invalid-xml", "a second stream header")
            }
            if let to = root.attribute("to"), !acceptedDomains.contains(to) {
                return [.send(header), .violation(condition: "host-unknown", detail: "stream addressed to \(to), not \(domain)")]
            }
            if authenticated {
                state = .awaitingBind
                return [.send(header + "<stream:features><bind xmlns=\"\(XMPPNamespace.bind)\"/><session xmlns=\"\(XMPPNamespace.session)\"/></stream:features>")]
            }
            state = .awaitingAuth
            return [.send(header + "<stream:features><mechanisms xmlns=\"\(XMPPNamespace.sasl)\"><mechanism>X-OAUTH2</mechanism><mechanism>X-GOOGLE-TOKEN</mechanism><mechanism>PLAIN</mechanism></mechanisms></stream:features>")]
        case .stanza(let element):
            return handle(element)
        case .oversizedStanza(let stanza):
            // The simulator's parser ends the stream on one (as CCS does); if it ever read one on.
            return violate("policy-violation", "a <\(stanza.name)> of \(stanza.byteCount) bytes, over the size limit")
        }
    }

    private mutating func handle(_ element: XMLElement) -> [Action] {
        switch state {
        case .awaitingHeader, .ended:
            return violate("invalid-xml", "stanza before the stream header")
        case .awaitingAuth:
            guard element.name == "auth", element.namespace == XMPPNamespace.sasl else {
                return violate("not-authorized", "<\(element.name)> before authentication")
            }
            guard element.attribute("mechanism") == "PLAIN" else {
                return refuse("invalid-mechanism", "mechanism \(element.attribute("mechanism") ?? "none") is not supported here")
            }
            guard let decoded = Data(base64Encoded: element.text.trimmingCharacters(in: .whitespacesAndNewlines)) else {
                return refuse("incorrect-encoding", "the PLAIN token is not base64")
            }
            let parts = decoded.split(separator: 0, omittingEmptySubsequences: false).map { String(decoding: $0, as: UTF8.self) }
            guard parts.count == 3 else { return refuse("malformed-request", "the PLAIN token is not authzid\\0authcid\\0password") }
            let identity = parts[1], password = parts[2]
            // `SENDER_ID@domain`, or the bare sender ID (aioxmpp-based clients send the
            // JID's localpart as the authentication identity).
            let pieces = identity.split(separator: "@", maxSplits: 1).map(String.init)
            guard pieces.first == senderID, pieces.count == 1 || acceptedDomains.contains(pieces[1]), password == serverKey else {
                return refuse("not-authorized", "wrong sender ID, domain or server key for \(identity)")
            }
            state = .awaitingHeader(authenticated: true)
            return [.send("<success xmlns=\"\(XMPPNamespace.sasl)\"/>"), .restartStream, .authenticated(identity: identity)]
        case .awaitingBind:
            guard element.name == "iq", element.attribute("type") == "set",
                  let id = element.attribute("id"), element.child("bind", namespace: XMPPNamespace.bind) != nil else {
                return violate("not-authorized", "expected a bind request, got <\(element.name)>")
            }
            let resource = String(UUID().uuidString.prefix(8))
            let jid = "\(senderID)@\(domain)/\(resource)"
            state = .established(jid: jid)
            return [.send("<iq type=\"result\" id=\"\(XMLEscaping.escapeText(id))\"><bind xmlns=\"\(XMPPNamespace.bind)\"><jid>\(jid)</jid></bind></iq>"),
                    .bound(jid: jid)]
        case .established:
            if element.name == "iq", element.child("session", namespace: XMPPNamespace.session) != nil {
                return [.send("<iq type=\"result\" id=\"\(XMLEscaping.escapeText(element.attribute("id") ?? ""))\"/>")]
            }
            if element.name == "iq", element.attribute("type") == "get", element.child("ping", namespace: XMPPNamespace.ping) != nil {
                return [.pingAnswered, .send("<iq type=\"result\" id=\"\(XMLEscaping.escapeText(element.attribute("id") ?? ""))\" from=\"\(domain)\"/>")]
            }
            return [.stanza(element)]
        }
    }

    private mutating func refuse(_ condition: String, _ reason: String) -> [Action] {
        state = .ended
        return [.send("<failure xmlns=\"\(XMPPNamespace.sasl)\"><\(condition)/></failure>"), .refused(reason: reason)]
    }

    private mutating func violate(_ condition: String, _ detail: String) -> [Action] {
        state = .ended
        return [.violation(condition: condition, detail: detail)]
    }
}
