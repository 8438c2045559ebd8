import Runtime
import Transport

/// Why a connection could not be made or ended. Descriptions never contain the password.
public enum XMPPError: Error, Sendable, Equatable, CustomStringConvertible {
    /// TCP or TLS failed: resolution, connect, handshake, a refused certificate, a
    /// connection that broke.
    case transport(TransportError)
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
    /// The server closed the stream cleanly.
    case closedByPeer
    /// We closed the connection.
    case closedLocally

    /// The TCP connection broke (reset, EOF without a closing stream, I/O error).
    public static func connectionLost(_ reason: String) -> XMPPError { .transport(.connectionLost(reason)) }

    /// The XMPP view of a transport failure (a TLS close_notify is the peer closing).
    public init(_ transport: TransportError) {
        switch transport {
        case .closedByPeer: self = .closedByPeer
        case .cancelled: self = .closedLocally
        default: self = .transport(transport)
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
        case .authenticationRefused, .transport(.certificateRejected): true
        // The stream was addressed to a domain the server does not serve (`--xmpp-domain`).
        case .streamError(condition: "host-unknown", _): true
        default: false
        }
    }

    /// True when TLS refused the server's certificate.
    public var isCertificateRefusal: Bool {
        if case .transport(.certificateRejected) = self { return true }
        return false
    }

    public var description: String {
        switch self {
        case .transport(let error): "\(error)"
        case .authenticationRefused(let condition): "authentication refused (\(condition)): the server rejected the sender ID or server key"
        case .streamError(let condition, let text): "stream error from server: \(condition)\(text.map { " (\($0))" } ?? "")"
        case .malformedStream(let error): "unusable stream from server: \(error)"
        case .protocolViolation(let reason): "protocol violation by server: \(reason)"
        case .negotiationTimedOut: "session negotiation (TLS, SASL, bind) timed out"
        case .peerUnresponsive(let silence): "no answer from server for \(silence.formattedSeconds) after a ping: connection presumed dead"
        case .closedByPeer: "the peer closed the stream"
        case .closedLocally: "closed by this side"
        }
    }
}
