import Foundation
import Testing
@testable import XMPP

private let credentials = SessionNegotiation.Credentials(
    domain: "gcm.googleapis.com", authenticationIdentity: "123@gcm.googleapis.com", password: "s3cr3t")

private func element(_ xml: String) throws -> XMLElement {
    let parser = XMLStreamParser()
    _ = try parser.feed("<stream:stream xmlns:stream=\"http://etherx.jabber.org/streams\" xmlns=\"jabber:client\">")
    guard case .stanza(let element)? = try parser.feed(xml).first else { throw XMLStreamError.malformed("no stanza in \(xml)") }
    return element
}

private let root = XMLElement("stream", namespace: XMPPNamespace.streams)
private let saslFeatures = "<stream:features><mechanisms xmlns=\"urn:ietf:params:xml:ns:xmpp-sasl\"><mechanism>X-OAUTH2</mechanism><mechanism>PLAIN</mechanism></mechanisms></stream:features>"
private let bindFeatures = "<stream:features><bind xmlns=\"urn:ietf:params:xml:ns:xmpp-bind\"/><session xmlns=\"urn:ietf:params:xml:ns:xmpp-session\"/></stream:features>"

@Suite struct SessionNegotiationTests {
    /// Drives a negotiation to the point after SASL success and bind request.
    private func negotiateToBind() throws -> (SessionNegotiation, String) {
        var negotiation = SessionNegotiation(credentials: credentials)
        #expect(negotiation.start() == [.send(negotiation.streamHeader)])
        #expect(negotiation.streamHeader.contains("to=\"gcm.googleapis.com\""))
        #expect(negotiation.handle(.streamOpened(root)) == [])
        let auth = negotiation.handle(.stanza(try element(saslFeatures)))
        let token = Data("\u{0}123@gcm.googleapis.com\u{0}s3cr3t".utf8).base64EncodedString()
        #expect(auth == [.send("<auth mechanism=\"PLAIN\" xmlns=\"urn:ietf:params:xml:ns:xmpp-sasl\">\(token)</auth>")])
        #expect(negotiation.handle(.stanza(try element("<success xmlns=\"urn:ietf:params:xml:ns:xmpp-sasl\"/>")))
                == [.restartStream, .send(negotiation.streamHeader)])
        #expect(negotiation.handle(.streamOpened(root)) == [])
        let bind = negotiation.handle(.stanza(try element(bindFeatures)))
        guard case .send(let request)? = bind.first, bind.count == 1 else {
            Issue.record("no bind request: \(bind)")
            return (negotiation, "")
        }
        #expect(request.contains("<bind xmlns=\"urn:ietf:params:xml:ns:xmpp-bind\"/>"))
        guard case .binding(let id) = negotiation.state else {
            Issue.record("not binding: \(negotiation.state)")
            return (negotiation, "")
        }
        return (negotiation, id)
    }

    @Test func fullNegotiationWithSession() throws {
        var (negotiation, bindID) = try negotiateToBind()
        let actions = negotiation.handle(.stanza(try element(
            "<iq type=\"result\" id=\"\(bindID)\"><bind xmlns=\"urn:ietf:params:xml:ns:xmpp-bind\"><jid>123@gcm.googleapis.com/R1</jid></bind></iq>")))
        guard case .send(let sessionRequest)? = actions.first, case .startingSession(let sessionID, _) = negotiation.state else {
            Issue.record("no session request: \(actions)")
            return
        }
        #expect(sessionRequest.contains("urn:ietf:params:xml:ns:xmpp-session"))
        #expect(negotiation.handle(.stanza(try element("<iq type=\"result\" id=\"\(sessionID)\"/>")))
                == [.established(jid: "123@gcm.googleapis.com/R1")])
        #expect(negotiation.state == .established(jid: "123@gcm.googleapis.com/R1"))
    }

    @Test func messagesArrivingBeforeTheSessionResultAreDeliveredAfterIt() throws {
        var (negotiation, bindID) = try negotiateToBind()
        _ = negotiation.handle(.stanza(try element(
            "<iq type=\"result\" id=\"\(bindID)\"><bind xmlns=\"urn:ietf:params:xml:ns:xmpp-bind\"><jid>j@d/r</jid></bind></iq>")))
        guard case .startingSession(let sessionID, _) = negotiation.state else { Issue.record("no session step"); return }
        let early = try element("<message id=\"early\"><gcm xmlns=\"google:mobile:data\">{}</gcm></message>")
        #expect(negotiation.handle(.stanza(early)) == [])
        #expect(negotiation.handle(.stanza(try element("<iq type=\"result\" id=\"\(sessionID)\"/>")))
                == [.established(jid: "j@d/r"), .deliver(early)])
    }

    /// A message over the size limit queued in CCS arrives as soon as the resource is bound:
    /// held with the others and delivered as oversized once the session is up (set aside,
    /// acked when its id can be read). It used to fail every negotiation: a poison message
    /// blocked the sender for good.
    @Test func anOversizedMessageBeforeTheSessionResultIsDeliveredAsOversizedAfterIt() throws {
        var (negotiation, bindID) = try negotiateToBind()
        _ = negotiation.handle(.stanza(try element(
            "<iq type=\"result\" id=\"\(bindID)\"><bind xmlns=\"urn:ietf:params:xml:ns:xmpp-bind\"><jid>j@d/r</jid></bind></iq>")))
        guard case .startingSession(let sessionID, _) = negotiation.state else { Issue.record("no session step"); return }
        let parser = XMLStreamParser(maxStanzaBytes: 1024, skipsOversizedStanzas: true)
        _ = try parser.feed("<stream:stream xmlns:stream=\"http://etherx.jabber.org/streams\" xmlns=\"jabber:client\">")
        let big = "<message id=\"m1\"><gcm xmlns=\"google:mobile:data\">{\"message_id\":\"big-1\",\"from\":\"t\",\"data\":{\"x\":\""
            + String(repeating: "a", count: 4096) + "\"}}</gcm></message>"
        guard case .oversizedStanza(let oversized)? = try parser.feed(big).first else { Issue.record("not oversized"); return }
        let small = try element("<message id=\"after\"><gcm xmlns=\"google:mobile:data\">{}</gcm></message>")
        #expect(negotiation.handle(.oversizedStanza(oversized)) == [])
        #expect(negotiation.handle(.stanza(small)) == [])
        #expect(negotiation.handle(.stanza(try element("<iq type=\"result\" id=\"\(sessionID)\"/>")))
                == [.established(jid: "j@d/r"), .deliverOversized(oversized), .deliver(small)])
    }

    @Test func optionalSessionIsSkipped() throws {
        var negotiation = SessionNegotiation(credentials: credentials)
        _ = negotiation.start()
        _ = negotiation.handle(.streamOpened(root))
        _ = negotiation.handle(.stanza(try element(saslFeatures)))
        _ = negotiation.handle(.stanza(try element("<success xmlns=\"urn:ietf:params:xml:ns:xmpp-sasl\"/>")))
        _ = negotiation.handle(.streamOpened(root))
        _ = negotiation.handle(.stanza(try element(
            "<stream:features><bind xmlns=\"urn:ietf:params:xml:ns:xmpp-bind\"/><session xmlns=\"urn:ietf:params:xml:ns:xmpp-session\"><optional/></session></stream:features>")))
        guard case .binding(let id) = negotiation.state else { Issue.record("not binding"); return }
        #expect(negotiation.handle(.stanza(try element(
            "<iq type=\"result\" id=\"\(id)\"><bind xmlns=\"urn:ietf:params:xml:ns:xmpp-bind\"><jid>a@b/c</jid></bind></iq>")))
                == [.established(jid: "a@b/c")])
    }

    @Test func notAuthorizedIsAnAuthenticationError() throws {
        var negotiation = SessionNegotiation(credentials: credentials)
        _ = negotiation.start()
        _ = negotiation.handle(.streamOpened(root))
        _ = negotiation.handle(.stanza(try element(saslFeatures)))
        let actions = negotiation.handle(.stanza(try element(
            "<failure xmlns=\"urn:ietf:params:xml:ns:xmpp-sasl\"><not-authorized/></failure>")))
        #expect(actions == [.fail(.authenticationRefused(condition: "not-authorized"))])
        #expect(XMPPError.authenticationRefused(condition: "not-authorized").isConfigurationError)
        #expect(!"\(negotiation.state) \(actions)".contains("s3cr3t"))
    }

    @Test func missingPlainIsAProtocolError() throws {
        var negotiation = SessionNegotiation(credentials: credentials)
        _ = negotiation.start()
        _ = negotiation.handle(.streamOpened(root))
        let actions = negotiation.handle(.stanza(try element(
            "<stream:features><mechanisms xmlns=\"urn:ietf:params:xml:ns:xmpp-sasl\"><mechanism>X-OAUTH2</mechanism></mechanisms></stream:features>")))
        guard case .fail(.protocolViolation(let reason))? = actions.first else { Issue.record("\(actions)"); return }
        #expect(reason.contains("PLAIN"))
    }

    @Test func streamErrorIsSurfacedWithItsCondition() throws {
        var (negotiation, _) = try negotiateToBind()
        let actions = negotiation.handle(.stanza(try element(
            "<stream:error><conflict xmlns=\"urn:ietf:params:xml:ns:xmpp-streams\"/><text xmlns=\"urn:ietf:params:xml:ns:xmpp-streams\">replaced</text></stream:error>")))
        #expect(actions == [.fail(.streamError(condition: "conflict", text: "replaced"))])
        #expect(negotiation.state == .ended)
    }

    @Test func establishedStreamAnswersPingsAndDeliversMessages() throws {
        var (negotiation, bindID) = try negotiateToBind()
        _ = negotiation.handle(.stanza(try element(
            "<iq type=\"result\" id=\"\(bindID)\"><bind xmlns=\"urn:ietf:params:xml:ns:xmpp-bind\"><jid>j@d/r</jid></bind></iq>")))
        if case .startingSession(let id, _) = negotiation.state {
            _ = negotiation.handle(.stanza(try element("<iq type=\"result\" id=\"\(id)\"/>")))
        }
        #expect(negotiation.handle(.stanza(try element(
            "<iq type=\"get\" id=\"s1\" from=\"gcm.googleapis.com\"><ping xmlns=\"urn:xmpp:ping\"/></iq>")))
                == [.send("<iq type=\"result\" id=\"s1\" to=\"gcm.googleapis.com\"/>")])
        let message = try element("<message><gcm xmlns=\"google:mobile:data\">{}</gcm></message>")
        #expect(negotiation.applicationStanza(.stanza(message)) == message)
        #expect(negotiation.handle(.stanza(message)) == [.deliver(message)])
        // The reader's shortcut takes exactly the stanzas `handle` would deliver as they are.
        let others: [XMLStreamEvent] = [
            .stanza(try element("<iq type=\"get\" id=\"s2\"><ping xmlns=\"urn:xmpp:ping\"/></iq>")),
            .stanza(try element("<iq type=\"result\" id=\"ping-1\"/>")),
            .stanza(try element("<stream:error xmlns:stream=\"http://etherx.jabber.org/streams\"><conflict xmlns=\"urn:ietf:params:xml:ns:xmpp-streams\"/></stream:error>")),
            .streamClosed,
        ]
        for event in others { #expect(negotiation.applicationStanza(event) == nil, "\(event)") }
        #expect(SessionNegotiation(credentials: credentials).applicationStanza(.stanza(message)) == nil,
                "before the session is established, nothing is delivered as it is")
        let ping = negotiation.makePing()
        #expect(ping.contains("urn:xmpp:ping"))
        #expect(negotiation.handle(.stanza(try element("<iq type=\"result\" id=\"ping-3\"/>"))) == [])
        guard case .send(let unsupported)? = negotiation.handle(.stanza(try element("<iq type=\"get\" id=\"v\"><query xmlns=\"jabber:iq:version\"/></iq>"))).first else {
            Issue.record("no answer to an unknown iq")
            return
        }
        #expect(unsupported.contains("service-unavailable"))
    }

    @Test func stanzasBeforeFeaturesAreProtocolViolations() throws {
        var negotiation = SessionNegotiation(credentials: credentials)
        _ = negotiation.start()
        _ = negotiation.handle(.streamOpened(root))
        guard case .fail(.protocolViolation)? = negotiation.handle(.stanza(try element("<message/>"))).first else {
            Issue.record("accepted a message before features")
            return
        }
    }
}

@Suite struct LivenessMonitorTests {
    @Test func pingsAfterIdleAndDeclaresDeathAfterTimeout() {
        var monitor = LivenessMonitor(idleInterval: .seconds(30), timeout: .seconds(10))
        let start = ContinuousClock.now
        #expect(monitor.tick(now: start + .seconds(29), lastHeard: start) == nil)
        #expect(monitor.nextDeadline(lastHeard: start) == start + .seconds(30))
        #expect(monitor.tick(now: start + .seconds(30), lastHeard: start) == .sendPing)
        #expect(monitor.nextDeadline(lastHeard: start) == start + .seconds(40))
        #expect(monitor.tick(now: start + .seconds(35), lastHeard: start) == nil)
        #expect(monitor.tick(now: start + .seconds(40), lastHeard: start) == .peerDead(silence: .seconds(40)))
    }

    @Test func anyTrafficAfterThePingKeepsThePeerAlive() {
        var monitor = LivenessMonitor(idleInterval: .seconds(30), timeout: .seconds(10))
        let start = ContinuousClock.now
        #expect(monitor.tick(now: start + .seconds(30), lastHeard: start) == .sendPing)
        let heard = start + .seconds(31)
        #expect(monitor.tick(now: start + .seconds(45), lastHeard: heard) == nil)
        #expect(monitor.nextDeadline(lastHeard: heard) == heard + .seconds(30))
        #expect(monitor.tick(now: heard + .seconds(30), lastHeard: heard) == .sendPing)
    }
}

@Suite struct LivenessWhilePausedTests {
    @Test func silenceWhileReadingIsPausedIsNotADeadPeer() {
        var monitor = LivenessMonitor(idleInterval: .seconds(30), timeout: .seconds(10))
        let start = ContinuousClock.now
        #expect(monitor.tick(now: start + .seconds(30), lastHeard: start) == .sendPing)
        // The consumer is full: reading pauses with a ping outstanding.
        monitor.pause(at: start + .seconds(31))
        #expect(monitor.nextDeadline(lastHeard: start) == nil)
        #expect(monitor.tick(now: start + .seconds(200), lastHeard: start) == nil)
        // Reading resumes 90 s later: the idle interval counts from there, with no ping pending.
        monitor.resume(at: start + .seconds(121))
        #expect(monitor.nextDeadline(lastHeard: start) == start + .seconds(151))
        #expect(monitor.tick(now: start + .seconds(140), lastHeard: start) == nil)
        #expect(monitor.tick(now: start + .seconds(151), lastHeard: start) == .sendPing)
        #expect(monitor.tick(now: start + .seconds(161), lastHeard: start) == .peerDead(silence: .seconds(40)))
    }
}
