import Runtime
import Transport

/// Everything needed to open one client session.
public struct XMPPClientConfiguration: Sendable {
    /// TCP host, also the TLS server name (SNI and certificate check).
    public var host: String
    public var port: Int
    public var credentials: SessionNegotiation.Credentials
    public var trust: TLSTrust
    public var connectTimeout: Duration = .seconds(10)
    /// TCP connect, TLS, SASL and bind together must finish within this.
    public var negotiationTimeout: Duration = .seconds(20)
    /// Ping the server after this long without hearing from it.
    public var pingInterval: Duration = .seconds(60)
    /// The server is dead if still silent this long after a ping.
    public var pingTimeout: Duration = .seconds(15)
    public var maxStanzaBytes = XMLStreamParser.defaultMaxStanzaBytes
    public var maxDepth = XMLStreamParser.defaultMaxDepth
    /// Received stanzas held for the consumer before the connection stops reading.
    public var inboundCapacity = 1024
    /// Bytes queued for writing before senders wait.
    public var outboundCapacityBytes = 1 << 20
    /// The nice value the connection's thread asks for (nil: leave it). Negative values put
    /// reading and acking ahead of handler and database work on a busy machine; they need
    /// root or `CAP_SYS_NICE`, and without it the thread runs at the default priority
    /// (`ThreadPriority.refusalCount` counts the refusals).
    public var threadNiceness: Int32? = nil

    public init(host: String, port: Int, credentials: SessionNegotiation.Credentials, trust: TLSTrust) {
        self.host = host
        self.port = port
        self.credentials = credentials
        self.trust = trust
    }
}
