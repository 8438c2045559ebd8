/// Why a TCP or TLS connection could not be made, or broke.
public enum TransportError: Error, Sendable, Equatable, CustomStringConvertible {
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
    /// The TCP connection broke (reset, EOF where more was expected, I/O error).
    case connectionLost(String)
    /// The peer ended the TLS session (close_notify).
    case closedByPeer
    /// A blocking exchange did not finish before its deadline.
    case timedOut(String)
    /// The exchange was given up because its task was cancelled (shutdown).
    case cancelled
    /// The connection broke after the request was fully written and before any answer:
    /// the server may or may not have processed it, so it is not sent again on its own.
    case outcomeUnknown(String)

    public var description: String {
        switch self {
        case .resolutionFailed(let host, let reason): "cannot resolve \(host): \(reason)"
        case .connectFailed(let host, let port, let reason): "cannot connect to \(host):\(port): \(reason)"
        case .connectTimedOut(let host, let port): "connecting to \(host):\(port) timed out"
        case .tlsFailed(let reason): "TLS handshake failed: \(reason)"
        case .certificateRejected(let reason):
            "the server's TLS certificate was refused: \(reason); check --ca-file and the endpoint host name"
        case .connectionLost(let reason): "connection lost: \(reason)"
        case .closedByPeer: "the peer closed the connection"
        case .timedOut(let what): "timed out: \(what)"
        case .cancelled: "cancelled"
        case .outcomeUnknown(let reason): "no answer after the request was sent (\(reason)): it may have been processed"
        }
    }

    /// A TLS handshake that did not finish within its time.
    public static let handshakeTimedOut = TransportError.tlsFailed("the TLS handshake timed out")

    /// True for `.outcomeUnknown`: the request may have been processed.
    public var isOutcomeUnknown: Bool { if case .outcomeUnknown = self { true } else { false } }
}
