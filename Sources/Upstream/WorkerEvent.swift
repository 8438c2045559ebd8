import FCM
import Foundation
import XMPP

/// What the worker did, for tests and embedding applications.
public enum WorkerEvent: Sendable {
    case connected(slot: Int, jid: String)
    case disconnected(slot: Int, reason: XMPPError)
    case reconnectScheduled(slot: Int, delay: Duration)
    /// An upstream message (or receipt) was acked on `connection`.
    case acked(connection: String, messageID: String)
    case unackable(slot: Int, raw: String)
    case unreadable(slot: Int, reason: String)
    /// A batch committed: the messages handled (id, arrival), duplicates skipped, dead letters written.
    case committed(handled: [(String, Date)], duplicates: Int, deadLettered: [String])
    case retryScheduled(messageID: String, attempt: Int, delay: Duration)
    case databaseUnavailable(String)
    case spooled(count: Int, path: String)
    /// The outbox sender listens for NOTIFY: rows inserted from now on wake it at once.
    case outboxListening
    case replayed(count: Int)
    /// `/metrics`, `/healthz` and `/readyz` are served on this port (`--metrics-address`).
    case serving(metricsPort: Int)
    /// The HTTPS ingress takes requests on this port (`--ingress-address`).
    case servingIngress(port: Int)
}

/// Receives `WorkerEvent`s as they happen, from any task.
public typealias WorkerObserver = @Sendable (WorkerEvent) -> Void
