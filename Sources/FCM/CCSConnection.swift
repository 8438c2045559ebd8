import Foundation
import Runtime
import Transport
import XMPP

/// One CCS session: an XMPP connection whose received stanzas come out typed
/// (`CCSInbound`), with the ack policy applied on the connection's own thread.
///
/// Upstream messages are acked there at once (immediate mode) or hand out a `DurableAck`
/// to send after their commit (durable mode); receipts are acked at once. Downstream
/// stanzas go out with `send(serialized:)`.
public final class CCSConnection: Sendable {
    private let connection: XMPPConnection<CCSInbound>

    /// The full JID CCS bound to this session.
    public var boundJID: String { connection.boundJID }
    /// A label for logs (`ccs#1.3`).
    public var label: String { connection.label }

    /// The XMPP connection underneath (for tests that watch its lifetime).
    var underlying: XMPPConnection<CCSInbound> { connection }

    private init(connection: XMPPConnection<CCSInbound>) {
        self.connection = connection
    }

    /// Connects, authenticates and binds.
    /// - Parameters:
    ///   - journal: where journal mode journals upstream messages (without one, journal
    ///     mode acks after the commit, like durable mode).
    ///   - onDraining: called on the connection's thread the moment a
    ///     `CONNECTION_DRAINING` control message is parsed (before anything after it).
    ///   - onAnswer: called on the connection's thread with each ack, nack, stanza error
    ///     and delivery receipt as it is parsed; one it returns true for is not handed out
    ///     by `next` (a receipt always is).
    ///     Answers then take no trip through a consuming task. Keep it fast and
    ///     non-blocking: it runs on the I/O thread.
    ///   - afterRead: called on the connection's thread once the stanzas of a read have
    ///     all been through `onAnswer` (what it took can be handed on together there).
    /// - Throws: `XMPPError` (`isConfigurationError` for refused credentials, a refused
    ///   certificate or an unknown XMPP domain).
    public static func connect(_ configuration: XMPPClientConfiguration, ackMode: CCSAckMode, journal: (any CCSJournal)? = nil,
                               tls: TLSContext, label: String,
                               onDraining: @escaping @Sendable () -> Void = {},
                               onAnswer: @escaping @Sendable (CCSInbound) -> Bool = { _ in false },
                               afterRead: @escaping @Sendable () -> Void = {}) async throws -> CCSConnection {
        let route = CCSAckRoute(label: label)
        let interceptor = CCSInterceptor(ackMode: ackMode, journal: journal, route: route, onDraining: onDraining, onAnswer: onAnswer,
                                         afterRead: afterRead)
        let connection = try await XMPPConnection.connect(configuration, interceptor: interceptor, tls: tls, label: label)
        route.bind(connection)
        return CCSConnection(connection: connection)
    }

    /// Everything received and waiting (at most `maximum`, at least one), in arrival
    /// order; nil once the stream has ended and all was taken, or when the task is
    /// cancelled while nothing is waiting.
    public func next(maximum: Int) async -> [CCSInbound]? {
        await connection.nextBoxed(maximum: maximum)?.map(CCSInterceptor.unbox)
    }

    /// Queues already serialized stanzas (downstream messages), waiting while the write
    /// buffer is full. Returns false, with nothing queued, once CCS has announced
    /// `CONNECTION_DRAINING` on this connection (the gate closes on the connection's thread
    /// as the control message is parsed, so nothing sent after it was read reaches CCS;
    /// what was queued before it goes out ahead of any later reply): send them on another.
    /// - Throws: the `XMPPError` the stream ended with, or `CancellationError`.
    @discardableResult
    public func send(serialized stanzas: String) async throws -> Bool {
        try await connection.sendUnlessGateClosed(serialized: stanzas)
    }

    /// Stops reading: stanzas arriving from now on are neither acked nor handed out (CCS
    /// redelivers them); `next` returns what was already received, then nil. Sending
    /// (durable acks among it) still works until `close()`.
    public func stopReceiving() { connection.stopReceiving() }

    /// Sends what is queued, closes the stream and waits until the socket is closed.
    public func close() async { await connection.close() }

    /// Drops the connection at once.
    public func abort() { connection.abort() }

    /// Waits until the stream has ended and returns why.
    public func closed() async -> XMPPError { await connection.closed() }

    public var isClosed: Bool { connection.isClosed }
}
