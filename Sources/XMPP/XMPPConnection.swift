import Runtime
import Transport

/// One established client XMPP session over TLS.
///
/// `connect` returns once the stream is authenticated and bound. What its interceptor
/// makes of each received stanza (`Inbound`; the stanza itself with `PassThrough`) comes
/// out of `next()` in arrival order; `send` may be called from any task and waits when the
/// peer is slow to read. Server pings are answered and an idle server is pinged without
/// the caller's help. The session's socket, `SSL*` and parser belong to one thread.
public final class XMPPConnection<Inbound: Sendable>: Sendable {
    /// The full JID the server bound to this session.
    public let boundJID: String
    /// A label for logs (`host:port#n`).
    public let label: String
    private let loop: StreamLoop
    /// The stream's loop (for tests that watch its lifetime).
    var streamLoop: StreamLoop { loop }
    private let inbox: StanzaInbox
    /// Opens the inbox's items: the interceptor's `unbox`.
    private let unbox: @Sendable (StanzaInbox.Item) -> Inbound
    private let ending: OneShot<XMPPError>

    private init(boundJID: String, label: String, loop: StreamLoop, inbox: StanzaInbox, unbox: @escaping @Sendable (StanzaInbox.Item) -> Inbound,
                 ending: OneShot<XMPPError>) {
        self.boundJID = boundJID
        self.label = label
        self.loop = loop
        self.inbox = inbox
        self.unbox = unbox
        self.ending = ending
    }

    /// Connects with `tls` (shared by a pool of connections), negotiates TLS,
    /// authenticates and binds; `interceptor` then runs on the connection's thread for
    /// every stanza received.
    /// - Throws: `XMPPError`, for instance `.authenticationRefused` for bad credentials or
    ///   `.transport(.certificateRejected)` for an untrusted or mismatched certificate.
    public static func connect(_ configuration: XMPPClientConfiguration, interceptor: some StanzaInterceptor<Inbound>,
                               tls: TLSContext, label: String? = nil) async throws -> XMPPConnection {
        let name = label ?? "\(configuration.host):\(configuration.port)"
        let wake = WakeRelay()
        let inbox = StanzaInbox(capacity: configuration.inboundCapacity, onRoom: { wake.fire() })
        let driver = ClientStreamDriver(configuration: configuration, interceptor: interceptor, inbox: inbox)
        let loop: StreamLoop
        do {
            loop = try StreamLoop(
                name: "xmpp \(name)",
                origin: .connect(host: configuration.host, port: configuration.port, timeout: configuration.connectTimeout),
                tlsContext: tls, role: .client(serverName: configuration.host),
                handshakeTimeout: configuration.negotiationTimeout, closingTail: "</stream:stream>",
                outboundCapacity: configuration.outboundCapacityBytes, niceness: configuration.threadNiceness, driver: driver)
        } catch {
            throw XMPPError.transport(error)
        }
        wake.target = loop
        loop.start()
        let jid = try await withTaskCancellationHandler {
            try await driver.establishment.value()
        } onCancel: {
            loop.requestClose(.abort(XMPPError.closedLocally))
        }
        let interceptorType = type(of: interceptor)
        return XMPPConnection(boundJID: jid, label: name, loop: loop, inbox: inbox, unbox: { interceptorType.unbox($0) },
                              ending: driver.ending)
    }

    /// What the next received stanza became, or nil once the stream has ended (see
    /// `closed()`) or the task is cancelled while nothing is waiting.
    public func next() async -> Inbound? {
        await inbox.take(maximum: 1).first.map(unbox)
    }

    /// Everything received and waiting (at most `maximum`, at least one), in arrival
    /// order; nil once the stream has ended and all was taken (or on cancellation while
    /// nothing is waiting).
    public func next(maximum: Int) async -> [Inbound]? {
        await nextBoxed(maximum: maximum)?.map(unbox)
    }

    /// `next(maximum:)` as the inbox holds it: what the interceptor's `box` made of each
    /// stanza. A caller that knows the interceptor's type opens them with its `unbox`, in
    /// code compiled for that type: `next(maximum:)`, generic over `Inbound` across modules,
    /// runs unspecialized, and made a heap allocation per stanza for its temporaries.
    package func nextBoxed(maximum: Int) async -> [any AnyObject & Sendable]? {
        let items = await inbox.take(maximum: maximum)
        return items.isEmpty ? nil : items
    }

    /// Queues `stanza` for sending, waiting while the write buffer is full.
    /// - Throws: the `XMPPError` the stream ended with, or `CancellationError`.
    public func send(_ stanza: XMLElement) async throws {
        try await send(serialized: stanza.serialized())
    }

    /// Queues an already serialized stanza (it must be one complete, well-formed element).
    public func send(serialized stanza: String) async throws {
        _ = try await queue(stanza, gated: false)
    }

    /// Queues an already serialized stanza (one complete, well-formed element), waiting
    /// while the write buffer is full, unless the send gate is closed (an interception
    /// with `closesSendGate`): then it queues nothing and returns false.
    /// - Throws: the `XMPPError` the stream ended with, or `CancellationError`.
    public func sendUnlessGateClosed(serialized stanza: String) async throws -> Bool {
        try await queue(stanza, gated: true)
    }

    private func queue(_ stanza: String, gated: Bool) async throws -> Bool {
        let chunk = OutboundBuffer.Chunk(bytes: Array(stanza.utf8), recordSize: StreamLoop.recordSize)
        do {
            if gated { return try await loop.outbound.enqueueUnlessGateClosed(chunk) }
            try await loop.outbound.enqueue(chunk)
            return true
        } catch let error as CancellationError {
            throw error
        } catch {
            throw XMPPError(ending: error)
        }
    }

    /// Queues an already serialized stanza at once, past the outbound buffer's bound: for
    /// small stanzas whose number the protocol bounds (acks), from a thread that must not
    /// wait.
    /// - Throws: `XMPPError` when the stream has ended.
    public func sendWithoutWaiting(serialized stanza: String) throws {
        do {
            try loop.outbound.enqueueWithoutWaiting(.init(bytes: Array(stanza.utf8), recordSize: StreamLoop.recordSize))
        } catch {
            throw XMPPError(ending: error)
        }
    }

    /// Closes the stream gracefully (queued stanzas are sent first, then
    /// `</stream:stream>` and a TLS close_notify) and waits until the socket is closed.
    public func close() async {
        loop.requestClose(.graceful(XMPPError.closedLocally))
        _ = try? await ending.value()
    }

    /// Stops receiving: the socket is no longer read and stanzas arriving from now on are
    /// refused (not intercepted: FCM does not ack them, so CCS redelivers them); `next()`
    /// returns what was already queued, then nil. Sending still works, so acks can be flushed before `close()`.
    public func stopReceiving() {
        inbox.close(refusingOffers: true)
    }

    /// Starts a graceful close without waiting for it (usable from a cancellation handler).
    public func requestClose() {
        loop.requestClose(.graceful(XMPPError.closedLocally))
    }

    /// Drops the connection at once without closing the stream.
    public func abort() {
        loop.requestClose(.abort(XMPPError.closedLocally))
    }

    /// Waits until the stream has ended and returns why (`.closedLocally` after `close()`).
    public func closed() async -> XMPPError {
        (try? await ending.value()) ?? .closedLocally
    }

    /// True once the stream has ended.
    public var isClosed: Bool { ending.isCompleted }
}

extension XMPPConnection where Inbound == XMLElement {
    /// Connects a plain session: `next()` returns the stanzas as received.
    public static func connect(_ configuration: XMPPClientConfiguration, label: String? = nil) async throws -> XMPPConnection<XMLElement> {
        try await connect(configuration, interceptor: PassThrough(), tls: try TLSContext.client(trust: configuration.trust), label: label)
    }
}

/// Lets the inbox wake a loop that is created after it. `@unchecked Sendable`: its one
/// reference is written once before the loop starts and only read afterwards.
final class WakeRelay: @unchecked Sendable {
    // Written once before the loop starts, read afterwards: no race. Weak: the loop holds
    // its driver, which holds the inbox, which holds this relay; a strong reference closed
    // that cycle and kept every ended connection's loop (its buffers and wake pipe) alive.
    weak var target: StreamLoop?
    func fire() { target?.wake() }
}
