import Runtime
import Transport

/// Runs a client session on its stream's thread: negotiation, liveness, and handing
/// stanzas to the consuming task.
final class ClientStreamDriver: StreamDriver {
    let inbox: StanzaInbox
    private let reader: XMLStreamReader
    /// Fulfilled with the bound JID, or failed with why the session never came up.
    let establishment = OneShot<String>()
    /// Fulfilled once with why the stream ended.
    let ending = OneShot<XMPPError>()

    private var negotiation: SessionNegotiation
    private var liveness: LivenessMonitor
    private var negotiationDeadline: ContinuousClock.Instant?
    private var established = false

    /// The interceptor, its result type-erased for the inbox (`StanzaInterceptor.interceptBoxed`).
    private let intercept: (XMLElement) -> BoxedInterception
    /// The interceptor's `interceptOversizedBoxed`.
    private let interceptOversized: (OversizedStanza) -> BoxedInterception
    /// The interceptor's `didInterceptRead`.
    private let readIntercepted: () -> Void

    init<Inbound>(configuration: XMPPClientConfiguration, interceptor: some StanzaInterceptor<Inbound>, inbox: StanzaInbox) {
        self.inbox = inbox
        self.intercept = { interceptor.interceptBoxed($0) }
        self.interceptOversized = { interceptor.interceptOversizedBoxed($0) }
        self.readIntercepted = { interceptor.didInterceptRead() }
        self.reader = XMLStreamReader(maxStanzaBytes: configuration.maxStanzaBytes, maxDepth: configuration.maxDepth,
                                      skipsOversizedStanzas: true)
        self.negotiation = SessionNegotiation(credentials: configuration.credentials)
        self.liveness = LivenessMonitor(idleInterval: configuration.pingInterval, timeout: configuration.pingTimeout)
        self.negotiationDeadline = .now + configuration.negotiationTimeout
    }

    func streamDidOpen(_ loop: StreamLoop) {
        perform(negotiation.start(), on: loop)
    }

    func stream(_ loop: StreamLoop, didRead bytes: UnsafeRawBufferPointer) {
        reader.read(bytes, on: loop) { event in
            if let stanza = negotiation.applicationStanza(event) {
                deliver(on: loop) { intercept(stanza) }
            } else {
                perform(negotiation.handle(event), on: loop)
            }
        }
        if established { readIntercepted() }
        // The read's stanzas reach the consumer together: one resumption per read.
        inbox.handOver()
    }

    func streamDidWake(_ loop: StreamLoop) {
        let now = ContinuousClock.now
        if let deadline = negotiationDeadline, now >= deadline {
            loop.abort(reason: XMPPError.negotiationTimedOut)
            return
        }
        guard established else { return }
        // While the consumer is full the socket is not read: the peer's silence is ours.
        if inbox.hasRoom { liveness.resume(at: now) } else { liveness.pause(at: now) }
        switch liveness.tick(now: now, lastHeard: loop.lastReadAt) {
        case .sendPing?: loop.write(negotiation.makePing())
        case .peerDead(let silence)?: loop.abort(reason: XMPPError.peerUnresponsive(silence: silence))
        case nil: break
        }
    }

    var wantsToRead: Bool { !established || inbox.hasRoom }

    func nextDeadline(_ loop: StreamLoop) -> ContinuousClock.Instant? {
        negotiationDeadline ?? (established ? liveness.nextDeadline(lastHeard: loop.lastReadAt) : nil)
    }

    func streamDidEnd(_ loop: StreamLoop, reason: any Error) {
        let reason = XMPPError(ending: reason)
        establishment.complete(.failure(reason))
        inbox.close()
        ending.complete(.success(reason))
    }

    /// Intercepts a stanza and queues what the interceptor makes of it, together: once
    /// receiving stopped, a stanza is not intercepted at all (not acked, not journaled), and
    /// one intercepted always reaches the consumer. Its reply (an ack) is written after.
    private func deliver(on loop: StreamLoop, _ intercept: () -> BoxedInterception) {
        var intercepted: BoxedInterception?
        let offered = inbox.offer { () -> StanzaInbox.Item? in
            let interception = intercept()
            intercepted = interception
            return interception.item
        }
        guard let interception = intercepted, offered != .refused else { return }
        if interception.closesSendGate { loop.closeGate() }
        if let reply = interception.reply { loop.write(reply) }
    }

    private func perform(_ actions: [SessionNegotiation.Action], on loop: StreamLoop) {
        for action in actions {
            switch action {
            case .send(let text): loop.write(text)
            case .restartStream: reader.restart()
            case .established(let jid):
                established = true
                negotiationDeadline = nil
                establishment.complete(.success(jid))
            case .deliver(let stanza):
                deliver(on: loop) { intercept(stanza) }
            case .deliverOversized(let stanza):
                deliver(on: loop) { interceptOversized(stanza) }
            case .fail(let error):
                loop.close(reason: error)
                return
            }
        }
    }
}
