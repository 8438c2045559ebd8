import FCM
import Transport
import XMPP

/// How the simulated FCM behaves.
public struct SimulatorConfiguration: Sendable {
    /// The credentials it accepts.
    public var senderID: String
    public var serverKey: String
    /// The XMPP domain of the service (what the client must address its stream to).
    public var domain = "gcm.googleapis.com"
    /// Where to listen; port 0 picks a free port.
    public var host = "127.0.0.1"
    public var port = 0
    public var identity: TLSIdentity
    /// The flow-control window CCS enforces: downstream messages pending per connection.
    public var maxPendingDownstream = 100
    /// How long after `CONNECTION_DRAINING` downstream messages on that connection are
    /// still taken as crossing it on the wire (nacked, not counted as violations).
    public var drainingGrace: Duration = .milliseconds(200)
    /// CCS stops delivering upstream messages to a connection with this many unacked.
    public var maxUnackedUpstream = 100
    /// Send a single-space keepalive this often (nil: never).
    public var whitespaceKeepaliveInterval: Duration?
    /// How each downstream message is answered (default: ack at once).
    public var responder: @Sendable (DownstreamRequest) -> DownstreamResponse = { _ in .ack() }
    /// Largest stanza accepted from the client.
    public var maxStanzaBytes = XMLStreamParser.defaultMaxStanzaBytes
    /// The nice value session threads ask for (nil: leave it). Benchmarks raise it so that
    /// the simulator, which stands in for servers on other machines, does not queue behind
    /// the worker on shared cores and add that wait to the latencies it measures.
    public var threadNiceness: Int32?
    /// Keep every event in memory for `events` and `wait(for:)` (off for long benchmarks,
    /// which read `counters` instead).
    public var recordsEvents = true
    /// Keep every upstream ack's latency for `ackLatencyMicroseconds` (4 bytes a message:
    /// off for a long-running simulator, such as the soak's).
    public var recordsAckLatencies = true
    /// Bytes sent before the first stream header, to play a hostile server in tests (for
    /// instance a DOCTYPE with an entity bomb). Nil for a well-behaved server.
    public var preamble: String?
    /// Called with every event as it happens (the `simulate` command prints them).
    public var onEvent: (@Sendable (SimulatorEvent) -> Void)?

    public init(senderID: String, serverKey: String, identity: TLSIdentity) {
        self.senderID = senderID
        self.serverKey = serverKey
        self.identity = identity
    }
}

/// A downstream message as the simulator received it.
public struct DownstreamRequest: Sendable {
    public var session: Int
    public var messageID: String
    public var json: JSONValue
    /// The `to` field (token, notification key or topic), if any.
    public var to: String? { json["to"]?.stringValue }
}

/// How the simulator answers one downstream message.
public enum DownstreamResponse: Sendable, Equatable {
    /// `message_type: ack`, optionally with a canonical `registration_id`, after `delay`.
    case ack(delay: Duration = .zero, canonicalRegistrationID: String? = nil)
    /// `message_type: nack` with this error code (docs/protocol.md section 4), after `delay`.
    case nack(error: String, description: String? = nil, delay: Duration = .zero)
    /// A `<message type="error">` stanza error echoing the stanza id.
    case stanzaError(condition: String, text: String)
    /// A stanza error without the stanza id; with `echoingPayload`, it carries the
    /// original `<gcm>` payload (RFC 6120 §8.3.1), which names the message.
    case stanzaErrorWithoutID(condition: String, text: String, echoingPayload: Bool)
    /// No answer at all: the slot stays taken (until the connection is lost).
    case noAnswer
}
