import Foundation
@testable import Simulator
import Testing
import XMPP

/// The simulated CCS's side of session setup as pure state, fed the bytes a client sends
/// through the same parser the simulator reads with.
@Suite struct CCSServerNegotiationTests {
    private static let header = "<stream:stream to=\"fcm.googleapis.com\" version=\"1.0\" xmlns=\"jabber:client\" xmlns:stream=\"http://etherx.jabber.org/streams\">"

    /// A server negotiation and the parser of the client's stream, as the simulator keeps them.
    private struct Server {
        var negotiation = CCSServerNegotiation(senderID: "123", serverKey: "s3cr3t", domain: "fcm.googleapis.com")
        var parser = XMLStreamParser()

        /// What the server does with `text` from the client.
        mutating func receive(_ text: String) throws -> [CCSServerNegotiation.Action] {
            var actions: [CCSServerNegotiation.Action] = []
            for event in try parser.feed(text) {
                let answer = negotiation.handle(event)
                actions += answer
                if answer.contains(.restartStream) { parser = XMLStreamParser() }
            }
            return actions
        }

        static func plain(_ identity: String, _ password: String) -> String {
            let token = Data("\u{0}\(identity)\u{0}\(password)".utf8).base64EncodedString()
            return "<auth mechanism=\"PLAIN\" xmlns=\"urn:ietf:params:xml:ns:xmpp-sasl\">\(token)</auth>"
        }
    }

    @Test func aClientThatFollowsTheProtocolIsAuthenticatedAndBound() throws {
        var server = Server()
        let features = try server.receive(Self.header)
        guard case .send(let first)? = features.first else { Issue.record("no features: \(features)"); return }
        #expect(first.contains("<mechanism>PLAIN</mechanism>"))
        #expect(try server.receive(Server.plain("123@fcm.googleapis.com", "s3cr3t"))
                == [.send("<success xmlns=\"urn:ietf:params:xml:ns:xmpp-sasl\"/>"), .restartStream,
                    .authenticated(identity: "123@fcm.googleapis.com")])
        let restarted = try server.receive(Self.header)
        guard case .send(let second)? = restarted.first else { Issue.record("no features: \(restarted)"); return }
        #expect(second.contains("<bind xmlns=\"urn:ietf:params:xml:ns:xmpp-bind\"/>"))
        let bound = try server.receive("<iq type=\"set\" id=\"b1\"><bind xmlns=\"urn:ietf:params:xml:ns:xmpp-bind\"/></iq>")
        guard case .bound(let jid)? = bound.last, case .established(jid) = server.negotiation.state else {
            Issue.record("not bound: \(bound)")
            return
        }
        #expect(jid.hasPrefix("123@fcm.googleapis.com/"))
        #expect(bound.first == .send("<iq type=\"result\" id=\"b1\"><bind xmlns=\"urn:ietf:params:xml:ns:xmpp-bind\"><jid>\(jid)</jid></bind></iq>"))
        // The optional session, a ping, then stanzas for the CCS logic.
        #expect(try server.receive("<iq type=\"set\" id=\"s1\"><session xmlns=\"urn:ietf:params:xml:ns:xmpp-session\"/></iq>")
                == [.send("<iq type=\"result\" id=\"s1\"/>")])
        #expect(try server.receive("<iq type=\"get\" id=\"p1\"><ping xmlns=\"urn:xmpp:ping\"/></iq>")
                == [.pingAnswered, .send("<iq type=\"result\" id=\"p1\" from=\"fcm.googleapis.com\"/>")])
        let message = try server.receive("<message id=\"m1\"><gcm xmlns=\"google:mobile:data\">{}</gcm></message>")
        guard case .stanza(let element)? = message.first, message.count == 1 else { Issue.record("not a stanza: \(message)"); return }
        #expect(element.name == "message")
        #expect(try server.receive("</stream:stream>") == [.clientClosed])
    }

    @Test(arguments: ["123", "123@gcm.googleapis.com", "123@fcm.googleapis.com"])
    func theIdentitiesPublishedClientsSendAreAccepted(identity: String) throws {
        var server = Server()
        _ = try server.receive(Self.header)
        #expect(try server.receive(Server.plain(identity, "s3cr3t")).contains(.authenticated(identity: identity)))
    }

    @Test(arguments: [("124@fcm.googleapis.com", "s3cr3t"), ("123@fcm.googleapis.com", "wrong"), ("123@example.com", "s3cr3t")])
    func wrongCredentialsAreRefusedNotAuthorized(identity: String, password: String) throws {
        var server = Server()
        _ = try server.receive(Self.header)
        let actions = try server.receive(Server.plain(identity, password))
        #expect(actions.first == .send("<failure xmlns=\"urn:ietf:params:xml:ns:xmpp-sasl\"><not-authorized/></failure>"))
        #expect(server.negotiation.state == .ended)
    }

    @Test func anotherMechanismIsRefused() throws {
        var server = Server()
        _ = try server.receive(Self.header)
        let actions = try server.receive("<auth mechanism=\"X-OAUTH2\" xmlns=\"urn:ietf:params:xml:ns:xmpp-sasl\">eA==</auth>")
        #expect(actions.first == .send("<failure xmlns=\"urn:ietf:params:xml:ns:xmpp-sasl\"><invalid-mechanism/></failure>"))
    }

    @Test func aStreamToAnotherHostIsAStreamError() throws {
        var server = Server()
        let actions = try server.receive(Self.header.replacingOccurrences(of: "fcm.googleapis.com", with: "example.com"))
        #expect(actions.last == .violation(condition: "host-unknown", detail: "stream addressed to example.com, not fcm.googleapis.com"))
    }

    @Test func aStanzaBeforeAuthenticationIsAStreamError() throws {
        var server = Server()
        _ = try server.receive(Self.header)
        let actions = try server.receive("<message id=\"m1\"/>")
        #expect(actions == [.violation(condition: "not-authorized", detail: "<message> before authentication")])
        #expect(server.negotiation.state == .ended)
    }

    @Test func aStanzaOtherThanABindAfterAuthenticationIsAStreamError() throws {
        var server = Server()
        _ = try server.receive(Self.header)
        _ = try server.receive(Server.plain("123", "s3cr3t"))
        _ = try server.receive(Self.header)
        let actions = try server.receive("<message id=\"m1\"/>")
        #expect(actions == [.violation(condition: "not-authorized", detail: "expected a bind request, got <message>")])
    }
}

/// The worker's session negotiation and the simulated CCS's, both as pure state, talking
/// through the real parser: each side's bytes are what the other reads.
@Suite struct NegotiationPairTests {
    /// Runs the two until neither has anything to send; returns the client's final state and
    /// the server's.
    private func negotiate(identity: String, password: String) throws -> (SessionNegotiation.State, CCSServerNegotiation.State) {
        var client = SessionNegotiation(credentials: .init(domain: "fcm.googleapis.com", authenticationIdentity: identity, password: password))
        var server = CCSServerNegotiation(senderID: "123", serverKey: "s3cr3t", domain: "fcm.googleapis.com")
        var clientParser = XMLStreamParser(), serverParser = XMLStreamParser()
        var toServer = client.start().compactMap { if case .send(let text) = $0 { text } else { nil } }
        var turns = 0
        while !toServer.isEmpty, turns < 20 {
            turns += 1
            var toClient: [String] = []
            for text in toServer {
                for event in try serverParser.feed(text) {
                    for action in server.handle(event) {
                        switch action {
                        case .send(let text): toClient.append(text)
                        case .restartStream: serverParser = XMLStreamParser()
                        default: break
                        }
                    }
                }
            }
            toServer = []
            for text in toClient {
                for event in try clientParser.feed(text) {
                    for action in client.handle(event) {
                        switch action {
                        case .send(let text): toServer.append(text)
                        case .restartStream: clientParser = XMLStreamParser()
                        default: break
                        }
                    }
                }
            }
        }
        return (client.state, server.state)
    }

    @Test func theWorkersClientAndTheSimulatedCCSAgreeOnASession() throws {
        let (client, server) = try negotiate(identity: "123@fcm.googleapis.com", password: "s3cr3t")
        guard case .established(let jid) = client else { Issue.record("client not established: \(client)"); return }
        #expect(server == .established(jid: jid))
    }

    @Test func aWrongServerKeyEndsBothSides() throws {
        let (client, server) = try negotiate(identity: "123@fcm.googleapis.com", password: "wrong")
        #expect(client == .ended)
        #expect(server == .ended)
    }
}
