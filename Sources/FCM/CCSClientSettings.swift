import XMPP

/// What a `CCSClient` needs of the worker's configuration: how many connections to keep,
/// each connection's XMPP settings, when its messages are acked, and the reconnect delays.
package struct CCSClientSettings: Sendable {
    /// One connection's endpoint, credentials, trust, pings and thread niceness.
    package var client: XMPPClientConfiguration
    /// How many connections to keep open at once.
    package var connections: Int
    /// When upstream messages are acked.
    package var ackMode: CCSAckMode
    /// Reconnect delays: full jitter from `reconnectBase` doubling to `reconnectCap`.
    package var reconnectBase: Duration
    package var reconnectCap: Duration

    package init(client: XMPPClientConfiguration, connections: Int, ackMode: CCSAckMode, reconnectBase: Duration, reconnectCap: Duration) {
        self.client = client
        self.connections = connections
        self.ackMode = ackMode
        self.reconnectBase = reconnectBase
        self.reconnectCap = reconnectCap
    }
}
