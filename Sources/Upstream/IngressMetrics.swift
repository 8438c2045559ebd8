import Foundation
import Ingress
import Runtime
import Synchronization

/// The HTTPS ingress's counters for `/metrics`: answers by status and reason, token
/// refusals by kind and reason, the time from a request's arrival to its answer, and the
/// age of each key set. Tokens and bodies are never part of a label.
package final class IngressMetrics: Sendable {
    private struct Key: Hashable {
        let status: Int
        let reason: String
    }

    private struct RefusalKey: Hashable {
        let kind: String
        let reason: String
    }

    private let answers = BlockingLock<[Key: Int]>([:])
    private let authFailures = BlockingLock<[RefusalKey: Int]>([:])
    private let answerSeconds = BlockingLock(Histogram.seconds)
    let keySources = BlockingLock<[(kind: String, source: FirebaseKeySource)]>([])

    /// Requests waiting for room in the pipeline's lanes now (`IngressWaitingRoom`).
    let waitingRequests = Atomic(0)
    /// Connections closed as they were accepted, by reason (`full`, `descriptors`, `draining`).
    private let refusedConnections = BlockingLock<[String: Int]>([:])
    /// Connections closed by a timer, by which (`handshake`, `idle`, `request`).
    private let timedOutConnections = BlockingLock<[String: Int]>([:])
    /// The connections open now and the most served at once (set by the service).
    let connectionGauges = BlockingLock<(open: @Sendable () -> Int, limit: Int)>(({ 0 }, 0))

    package init() {}

    func answered(status: Int, reason: String, after elapsed: Duration) {
        answers.withLock { $0[Key(status: status, reason: reason), default: 0] += 1 }
        answerSeconds.withLock { $0.observe(elapsed.seconds) }
    }

    /// A request the HTTP layer refused before the ingress saw it (malformed framing, a head
    /// or body over its limit, a request timeout): counted with the rest, no answer time.
    func refusedByHTTP(status: Int, reason: String) {
        answers.withLock { $0[Key(status: status, reason: reason), default: 0] += 1 }
    }

    func refusedConnection(reason: String) {
        refusedConnections.withLock { $0[reason, default: 0] += 1 }
    }

    func timedOutConnection(_ what: String) {
        timedOutConnections.withLock { $0[what, default: 0] += 1 }
    }

    func refusedToken(kind: String, reason: String) {
        authFailures.withLock { $0[RefusalKey(kind: kind, reason: reason), default: 0] += 1 }
    }

    package func render(into page: inout PrometheusText) {
        let answers = self.answers.withLock { $0 }.sorted { ($0.key.status, $0.key.reason) < ($1.key.status, $1.key.reason) }
        page.counter("fcm_worker_ingress_requests_total", "HTTPS ingress requests answered, by status and reason",
                     answers.map { ([("status", String($0.key.status)), ("reason", $0.key.reason)], Double($0.value)) })
        let failures = authFailures.withLock { $0 }.sorted { ($0.key.kind, $0.key.reason) < ($1.key.kind, $1.key.reason) }
        page.counter("fcm_worker_ingress_auth_failures_total", "tokens the HTTPS ingress refused, by kind and reason",
                     failures.map { ([("kind", $0.key.kind), ("reason", $0.key.reason)], Double($0.value)) })
        page.histogram("fcm_worker_ingress_answer_seconds",
                       "from a request's arrival to its answer (immediate: queued; journal: on disk; durable: committed)",
                       [([], answerSeconds.withLock { $0 })])
        page.gauge("fcm_worker_ingress_waiting_requests", "requests waiting for room in the pipeline's full lanes (--ingress-queue-wait)",
                   Double(waitingRequests.load(ordering: .relaxed)))
        let gauges = connectionGauges.withLock { $0 }
        page.gauge("fcm_worker_ingress_connections_open", "connections the HTTPS ingress serves now", Double(gauges.open()))
        page.gauge("fcm_worker_ingress_connections_limit", "the most it serves at once (--ingress-max-connections)", Double(gauges.limit))
        page.counter("fcm_worker_ingress_connections_refused_total",
                     "connections closed as they were accepted: full (at the limit), descriptors (the process out of them), draining",
                     refusedConnections.withLock { $0 }.sorted { $0.key < $1.key }.map { ([("reason", $0.key)], Double($0.value)) })
        page.counter("fcm_worker_ingress_connections_timed_out_total",
                     "connections closed by a timer: handshake, idle, request (a request not complete in time)",
                     timedOutConnections.withLock { $0 }.sorted { $0.key < $1.key }.map { ([("what", $0.key)], Double($0.value)) })
        page.gauge("fcm_worker_ingress_key_set_age_seconds", "seconds since each signing key set was fetched (-1 before the first fetch)",
                   keySources.withLock { $0 }.map { ([("kind", $0.kind)], $0.source.age ?? -1) })
    }
}
