import FCM

/// Something the simulator saw or did, in order. Tests wait on these.
public enum SimulatorEvent: Sendable, Equatable {
    case connected(session: Int)
    case authenticationRefused(session: Int, reason: String)
    case bound(session: Int, jid: String)
    case pingAnswered(session: Int)
    case upstreamDelivered(session: Int, messageID: String)
    case upstreamAcked(session: Int, messageID: String, latency: Duration)
    case downstreamReceived(session: Int, messageID: String)
    case downstreamAnswered(session: Int, messageID: String, response: DownstreamResponse)
    case receiptSent(session: Int, messageID: String)
    case drainingSent(session: Int)
    /// The client answered the ping that followed `CONNECTION_DRAINING`: it has read it.
    case drainingRead(session: Int)
    case violation(session: Int, ProtocolViolation)
    case closed(session: Int, reason: String)
}

/// A rule of docs/protocol.md the client broke. Any of these in a test is a bug in the worker.
public enum ProtocolViolation: Sendable, Equatable, CustomStringConvertible {
    /// An ack for a message id the simulator never delivered (or already forgot).
    case ackForUnknownMessage(String)
    /// An ack on another connection than the one the message came in on.
    case ackOnWrongConnection(messageID: String, deliveredOn: Int)
    /// An ack whose `to` is not the message's `from`.
    case ackToWrongAddress(messageID: String, expected: String, got: String)
    /// A second ack for a message already acked on this connection.
    case duplicateAck(String)
    /// The app server nacked an upstream message; it must only ack.
    case nackFromServer(String)
    /// More downstream messages pending than the window allows.
    case windowExceeded(pending: Int)
    /// A downstream message sent on a draining connection after the client had read
    /// `CONNECTION_DRAINING` (it answered the ping the simulator sends right after it) and
    /// the `drainingGrace` had passed.
    case sentWhileDraining(String)
    /// A stanza the simulator could not parse as CCS (bad JSON, missing fields).
    case malformedStanza(String)
    /// A stream-level breach (stanza before auth, bad header, broken XML).
    case stream(String)

    public var description: String {
        switch self {
        case .ackForUnknownMessage(let id): "ack for unknown message \(id)"
        case .ackOnWrongConnection(let id, let session): "ack for \(id) on the wrong connection (delivered on session \(session))"
        case .ackToWrongAddress(let id, let expected, let got): "ack for \(id) addressed to \(got), expected \(expected)"
        case .duplicateAck(let id): "duplicate ack for \(id)"
        case .nackFromServer(let id): "the app server nacked upstream message \(id)"
        case .windowExceeded(let pending): "\(pending) downstream messages pending, over the window"
        case .sentWhileDraining(let id): "downstream \(id) sent on a draining connection"
        case .malformedStanza(let detail): "malformed stanza: \(detail)"
        case .stream(let detail): "stream violation: \(detail)"
        }
    }
}

/// Running totals, cheap enough for benchmarks.
public struct SimulatorCounters: Sendable, Equatable {
    public var sessionsBound = 0
    public var upstreamDelivered = 0
    public var upstreamAcked = 0
    public var downstreamReceived = 0
    public var downstreamAcked = 0
    public var downstreamNacked = 0
    public var violations = 0
    /// The most downstream messages ever pending at once on one connection.
    public var peakPendingDownstream = 0
}

extension Array where Element == SimulatorEvent {
    /// Sessions that have bound and not closed, in binding order.
    public var openBoundSessions: [Int] {
        var open: [Int] = []
        for event in self {
            switch event {
            case .bound(let session, _): open.append(session)
            case .closed(let session, _): open.removeAll { $0 == session }
            default: break
            }
        }
        return open
    }
}
