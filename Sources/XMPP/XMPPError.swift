import Transport
import Runtime

/// Why a connection could not be made or ended. Descriptions never contain the password.
public enum XMPPError: Error, Sendable, Equatable, CustomStringConvertible {
    /// DNS could not resolve the host.
    case resolutionFailed(host: String, reason: String)
    /// No address of the host accepted a TCP connection.
    case connectFailed(host: String, port: Int, reason: String)
    /// TCP connect did not finish within the connect timeout.
    case connectTimedOut(host: String, port: Int)
    /// The TLS handshake failed for a reason other than the certificate.
    case tlsFailed(String)
    /// The server's certificate is untrusted, expired or for another host name.
    case certificateRejected(String)
    /// SASL failed: the server refused the credentials (for FCM: sender ID or server key).
    case authenticationRefused(condition: String)
    /// The server sent `<stream:error>` with this condition.
    case streamError(condition: String, text: String?)
    /// The incoming bytes broke XML or a parser limit.
    case malformedStream(XMLStreamError)
    /// The server broke the XMPP negotiation rules.
    case protocolViolation(String)
    /// Negotiation (TLS, SASL, bind) took longer than allowed.
    case negotiationTimedOut
    /// Nothing arrived within the ping timeout after a ping: the peer is presumed dead.
    case peerUnresponsive(silence: Duration)
    /// The TCP connection broke (reset, EOF without a closing stream, I/O error).
    case connectionLost(String)
    /// The server closed the stream cleanly.
    case closedByPeer
    /// We closed the connection.
    case closedLocally

    /// The XMPP view of a transport failure.
    public init(_ transport: TransportError) {
        switch transport {
        case .resolutionFailed(let host, let reason): self = .resolutionFailed(host: host, reason: reason)
        case .connectFailed(let host, let port, let reason): self = .connectFailed(host: host, port: port, reason: reason)
        case .connectTimedOut(let host, let port): self = .connectTimedOut(host: host, port: port)
        case .tlsFailed(let reason): self = .tlsFailed(reason)
        case .certificateRejected(let reason): self = .certificateRejected(reason)
        case .connectionLost(let reason): self = .connectionLost(reason)
        case .closedByPeer: self = .closedByPeer
        case .timedOut(let what): self = .connectionLost("timed out: \(what)")
        case .cancelled: self = .closedLocally
        case .outcomeUnknown(let reason): self = .connectionLost(reason)
        }
    }

    /// Why a stream ended, whatever layer said so.
    package init(ending reason: any Error) {
        switch reason {
        case let error as XMPPError: self = error
        case let error as TransportError: self = XMPPError(error)
        default: self = .connectionLost("\(reason)")
        }
    }

    /// True when retrying cannot help until someone changes the configuration
    /// (credentials, trust settings, the XMPP domain): callers stop instead of reconnecting
    /// in a loop.
    public var isConfigurationError: Bool {
        switch self {
        case .authenticationRefused, .certificateRejected: true
        // The stream was addressed to a domain the server does not serve (`--xmpp-domain`).
        case .streamError(condition: "host-unknown", _): true
        default: false
        }
    }

    public var description: String {
        switch self {
        case .resolutionFailed(let host, let reason): "cannot resolve \(host): \(reason)"
        case .connectFailed(let host, let port, let reason): "cannot connect to \(host):\(port): \(reason)"
        case .connectTimedOut(let host, let port): "connecting to \(host):\(port) timed out"
        case .tlsFailed(let reason): "TLS handshake failed: \(reason)"
        case .certificateRejected(let reason): "the server's TLS certificate was refused: \(reason); check --ca-file and the endpoint host name"
        case .authenticationRefused(let condition): "authentication refused (\(condition)): the server rejected the sender ID or server key"
        case .streamError(let condition, let text): "stream error from server: \(condition)\(text.map { " (\($0))" } ?? "")"
        case .malformedStream(let error): "unusable stream from server: \(error)"
        case .protocolViolation(let reason): "protocol violation by server: \(reason)"
        case .negotiationTimedOut: "session negotiation (TLS, SASL, bind) timed out"
        case .peerUnresponsive(let silence): "no answer from server for \(silence.formattedSeconds) after a ping: connection presumed dead"
        case .connectionLost(let reason): "connection lost: \(reason)"
        case .closedByPeer: "the peer closed the stream"
        case .closedLocally: "closed by this side"
        }
    }
}
