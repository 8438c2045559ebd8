import FCM
import Foundation
import Outbox
import Runtime
import Upstream
import Synchronization

/// The worker's counters, gauges and histograms, rendered as Prometheus text for
/// `/metrics` (see docs/operations.md for the reference).
///
/// Counting costs little: the upstream path takes one lock per read batch and one per
/// committed batch (never per message); downstream counts are taken per written update.
/// Gauges are read when scraped, from the parts that hold them (`Sources`), and the
/// outbox backlog from the database by the health probe, every 10 s while `/metrics` is
/// served (`ObservabilityService.backlogInterval`).
final class WorkerMetrics: OutboxMetrics, UpstreamMetrics {
    struct Upstream: Sendable {
        var received = 0
        var acked = 0
        var handled = 0
        var duplicates = 0
        var deadLettered: [String: Int] = [:]
        var retries = 0
        var spooled = 0
        var replayed = 0
        var lost = 0
        var batches = Histogram.sizes
        var commitSeconds = Histogram.seconds
        var receiveToCommit = Histogram.seconds
    }

    struct Connections: Sendable {
        var connects = 0
        var connectFailures = 0
        var disconnects = 0
        var drains = 0
    }

    struct HandlerCounts: Sendable {
        var runs = 0
        var failures = 0
    }

    struct DownstreamKey: Hashable, Sendable {
        let transport: String
        let value: String
    }

    /// One group of the outbox backlog, as the database last reported it.
    struct Backlog: Sendable, Equatable {
        var transport: String
        var status: String
        var rows: Int
        /// Seconds since the oldest row of the group fell due (0 when none is due).
        var oldestDueAge: Double
        /// Seconds since the oldest row of the group was queued, due or not.
        var oldestAge: Double = 0
    }

    /// Where the scrape reads the gauges.
    struct Sources: Sendable {
        var openConnections: @Sendable () -> Int = { 0 }
        var windows: @Sendable () -> [ConnectionWindow] = { [] }
        var queueDepth: @Sendable () -> Int = { 0 }
        var databaseConnections: @Sendable () -> (upstream: Int, outbox: Int) = { (0, 0) }
        /// The transports this worker can send (xmpp only with CCS connections, http only
        /// with a server key, v1 only with a service account).
        var sendableTransports: Set<String> = ["xmpp", "http", "v1"]
        /// False with `--connections 0`: readiness then asks for the ingress instead.
        var servesCCS = true
        /// Why the HTTPS ingress cannot take posts now (nil when it can, or runs not).
        var ingressUnready: @Sendable () -> String? = { nil }
        /// Told when the health probe reached the database (an outage's retries go at once).
        var databaseReached: @Sendable () -> Void = {}
        /// Whether v1 sending goes on now (false while stopped for a sender mismatch, or held
        /// for refused credentials or a token endpoint that cannot be reached).
        var v1CanSend: @Sendable () -> Bool = { true }
    }

    /// Transports whose rows this worker cannot send: v1 without a service account, xmpp
    /// without CCS connections, http without a server key.
    static let transports = ["xmpp", "http", "v1"]

    /// Rows of the backlog that this worker cannot send, by transport (every transport
    /// named, 0 for those it can send).
    static func unsendable(_ groups: [Backlog], sendable: Set<String>) -> [(transport: String, rows: Int)] {
        transports.map { transport in
            (transport, sendable.contains(transport) ? 0 : groups.filter { $0.transport == transport }.reduce(0) { $0 + $1.rows })
        }
    }

    let upstream = BlockingLock(Upstream())
    let connections = BlockingLock(Connections())
    let handlers = BlockingLock([String: HandlerCounts]())
    let downstream = BlockingLock([DownstreamKey: Int]())
    let downstreamErrors = BlockingLock([DownstreamKey: Int]())
    let downstreamRoundTrip = BlockingLock(Histogram.seconds)
    /// Rows found below the claim frontier and queued, by transport.
    let stranded = BlockingLock([String: Int]())
    /// v1 sending stopped for a sender mismatch (1), and how often it stopped.
    let v1Stopped = BlockingLock((now: false, times: 0))
    /// Journal mode: each group write and its `fdatasync`, and the messages it carried.
    let journalFlushes = BlockingLock((seconds: Histogram.seconds, sizes: Histogram.sizes, failures: 0))
    /// Journal mode: why the journal cannot be written now (nil while it can), for `/readyz`.
    let journalFailure = BlockingLock<String?>(nil)
    let databaseErrors = Atomic(0)
    let backlog = BlockingLock<[Backlog]>([])
    let sources = BlockingLock(Sources())
    /// The HTTPS ingress's counters (rendered whether or not it runs: zero without it).
    let ingress = IngressMetrics()
    /// Kept by the health check: whether the last database probe succeeded, and whether the
    /// worker's loops still run.
    let databaseReachable = Atomic(false)
    /// What the start waits for (the database), until the worker's layers run: readiness says it.
    let startup = BlockingLock<String?>(nil)
    /// What `/readyz` answered at the last look (every half second).
    let ready = Atomic(false)
    /// The server the last probe reached (nil before the first answer).
    let databaseServer = BlockingLock<DatabaseServer?>(nil)
    let started = Date()

    // MARK: Counting

    /// A read batch of a connection: `received` upstream messages (and dead letters),
    /// `acked` of them acked on arrival.
    func read(received: Int, acked: Int) {
        guard received > 0 || acked > 0 else { return }
        upstream.withLock {
            $0.received += received
            $0.acked += acked
        }
    }

    func durablyAcked(_ count: Int) {
        upstream.withLock { $0.acked += count }
    }

    /// A committed batch: its size, how long the commit took, the messages handled (with
    /// when they arrived), the duplicates skipped and the dead letters written by reason.
    func committed(batch size: Int, took seconds: Double, handled: [Date], duplicates: Int, deadLetters: [String], at now: Date) {
        var latencies = Histogram.seconds
        for arrival in handled { latencies.observe(max(0, now.timeIntervalSince(arrival))) }
        upstream.withLock { upstream in
            upstream.batches.observe(Double(size))
            upstream.commitSeconds.observe(seconds)
            upstream.receiveToCommit.merge(latencies)
            upstream.handled += handled.count
            upstream.duplicates += duplicates
            for reason in deadLetters { upstream.deadLettered[reason, default: 0] += 1 }
        }
    }

    func retried() {
        upstream.withLock { $0.retries += 1 }
    }

    func spooled(_ count: Int) {
        upstream.withLock { $0.spooled += count }
    }

    func replayed(_ count: Int) {
        upstream.withLock { $0.replayed += count }
    }

    func lost(_ count: Int) {
        upstream.withLock { $0.lost += count }
    }

    func handler(_ name: String, runs: Int, failed: Bool) {
        handlers.withLock { counts in
            counts[name, default: HandlerCounts()].runs += runs
            if failed { counts[name, default: HandlerCounts()].failures += 1 }
        }
    }

    /// Round trips of messages sent over XMPP, in seconds.
    func downstreamRoundTrips(_ seconds: [Double]) {
        downstreamRoundTrip.withLock { histogram in for value in seconds { histogram.observe(value) } }
    }

    /// Downstream rows moved to new states by `transport` (`xmpp`, `http`).
    func downstream(_ updates: [OutboxUpdate], transport: String) {
        guard !updates.isEmpty else { return }
        // Each update's status is read where it lies (by index): iterated, each update was
        // copied whole, a dozen fields' reference counts up and down.
        downstream.withLock { counts in
            // Counted in runs of one status (a list is mostly of one: the acks of a read, the
            // sends of a batch), so that the table is looked up once a run, not once a row.
            var status = updates[0].status
            var run = 0
            for index in updates.indices {
                if updates[index].status != status {
                    counts[DownstreamKey(transport: transport, value: Self.outcome(status)), default: 0] += run
                    status = updates[index].status
                    run = 0
                }
                run += 1
            }
            counts[DownstreamKey(transport: transport, value: Self.outcome(status)), default: 0] += run
        }
        let errors = updates.indices.compactMap { index -> String? in
            switch updates[index].status {
            case .failed, .retry, .expired: updates[index].errorCode
            default: nil
            }
        }
        guard !errors.isEmpty else { return }
        downstreamErrors.withLock { counts in
            for code in errors { counts[DownstreamKey(transport: transport, value: code), default: 0] += 1 }
        }
    }

    /// The outcome label of a row's new state.
    static func outcome(_ status: OutboxUpdate.Status) -> String {
        switch status {
        case .pending: "handed_back"
        case .sent: "sent"
        case .acked: "acked"
        case .delivered: "delivered"
        case .failed: "failed"
        case .retry: "retried"
        case .expired: "expired"
        }
    }

    func connection(_ event: WorkerEvent) {
        connections.withLock { counts in
            switch event {
            case .connected: counts.connects += 1
            case .disconnected: counts.disconnects += 1
            default: break
            }
        }
    }

    func downstreamOutcomes(transport: String) -> [String: Int] {
        downstream.withLock { counts in
            var outcomes: [String: Int] = [:]
            for (key, count) in counts where key.transport == transport { outcomes[key.value] = count }
            return outcomes
        }
    }

    func strandedRowsRescued(_ count: Int, transport: String) {
        stranded.withLock { $0[transport, default: 0] += count }
    }

    func v1SendingStopped(_ stopped: Bool) {
        v1Stopped.withLock { state in
            if stopped && !state.now { state.times += 1 }
            state.now = stopped
        }
    }

    func databaseError() { databaseErrors.add(1, ordering: .relaxed) }

    func journalFlushed(seconds: Double, records: Int) {
        journalFlushes.withLock {
            $0.seconds.observe(seconds)
            $0.sizes.observe(Double(records))
        }
    }

    func journalFailed(_ reason: String) {
        journalFlushes.withLock { $0.failures += 1 }
        journalFailure.withLock { $0 = reason }
    }

    func journalRecovered() { journalFailure.withLock { $0 = nil } }

    func connectFailed() { connections.withLock { $0.connectFailures += 1 } }
    func drained() { connections.withLock { $0.drains += 1 } }

    // MARK: Rendering

    /// The `/metrics` page.
    func render() -> String {
        var page = PrometheusText()
        let sources = self.sources.withLock { $0 }
        page.gauge("fcm_worker_build_info", "the running release, as a label", [([("version", WorkerMain.version)], 1)])
        page.gauge("fcm_worker_start_time_seconds", "when the worker started, seconds since the epoch", started.timeIntervalSince1970)

        let windows = sources.windows()
        let open = sources.openConnections()
        let draining = windows.count { $0.draining }
        page.gauge("fcm_worker_ccs_connections", "CCS connections by state", [([("state", "open")], Double(open)),
                                                                              ([("state", "draining")], Double(draining))])
        let links = connections.withLock { $0 }
        page.counter("fcm_worker_ccs_connects_total", "CCS sessions opened (authenticated and bound)", links.connects)
        page.counter("fcm_worker_ccs_connect_failures_total", "attempts to open a CCS session that failed", links.connectFailures)
        page.counter("fcm_worker_ccs_disconnects_total", "CCS sessions that ended (or failed to open)", links.disconnects)
        page.counter("fcm_worker_ccs_drains_total", "CONNECTION_DRAINING messages received", links.drains)
        page.gauge("fcm_worker_ccs_window_pending", "downstream messages awaiting CCS's answer, per connection (at most 100)",
                   windows.map { ([("connection", $0.label)], Double($0.pending)) })

        let counts = upstream.withLock { $0 }
        page.counter("fcm_worker_upstream_received_total", "upstream messages read from CCS (dead letters included)", counts.received)
        page.counter("fcm_worker_upstream_acked_total", "upstream messages acked to CCS", counts.acked)
        page.counter("fcm_worker_upstream_handled_total", "upstream messages whose handlers committed", counts.handled)
        page.counter("fcm_worker_upstream_duplicates_total", "redelivered upstream messages skipped (handled before)", counts.duplicates)
        page.counter("fcm_worker_upstream_dead_lettered_total", "upstream messages kept in dead_letters, by reason",
                     ["unackable", "unreadable", "unknown_type", "handler_failed", "unrouted", "oversized"]
                        .map { ([("reason", $0)], Double(counts.deadLettered[$0] ?? 0)) })
        page.counter("fcm_worker_upstream_unrouted_total", "upstream messages no handler's route matched (dead-lettered as unrouted)",
                     counts.deadLettered["unrouted"] ?? 0)
        page.counter("fcm_worker_upstream_retries_total", "handling attempts that failed and were scheduled again", counts.retries)
        page.counter("fcm_worker_upstream_spooled_total", "acked upstream messages spooled to disk at shutdown", counts.spooled)
        page.counter("fcm_worker_upstream_replayed_total",
                     "acked upstream messages a previous run left in the spool or the journal, replayed at this start", counts.replayed)
        page.counter("fcm_worker_upstream_lost_total", "acked upstream messages a shutdown could keep neither in the database nor on disk",
                     counts.lost)
        page.gauge("fcm_worker_upstream_queue_depth", "upstream messages queued or waiting for a retry", Double(sources.queueDepth()))
        page.histogram("fcm_worker_upstream_batch_size", "messages per committed batch", [([], counts.batches)])
        page.histogram("fcm_worker_upstream_commit_seconds", "time to commit one batch (handlers included)", [([], counts.commitSeconds)])
        page.histogram("fcm_worker_upstream_receive_to_commit_seconds",
                       "from reading a message to the commit of its handlers (in durable mode, about its ack delay)",
                       [([], counts.receiveToCommit)])

        let handlerCounts = handlers.withLock { $0 }.sorted { $0.key < $1.key }
        page.counter("fcm_worker_handler_runs_total", "messages given to each handler", handlerCounts.map { ([("handler", $0.key)], Double($0.value.runs)) })
        page.counter("fcm_worker_handler_failures_total", "handler calls that threw", handlerCounts.map { ([("handler", $0.key)], Double($0.value.failures)) })

        let outcomes = downstream.withLock { $0 }.sorted { ($0.key.transport, $0.key.value) < ($1.key.transport, $1.key.value) }
        page.counter("fcm_worker_downstream_total", "downstream rows moved to a new state, by transport and outcome",
                     outcomes.map { ([("transport", $0.key.transport), ("outcome", $0.key.value)], Double($0.value)) })
        let errors = downstreamErrors.withLock { $0 }.sorted { ($0.key.transport, $0.key.value) < ($1.key.transport, $1.key.value) }
        page.counter("fcm_worker_downstream_errors_total", "nack codes and errors of downstream messages that failed, will be retried or expired",
                     errors.map { ([("transport", $0.key.transport), ("code", $0.key.value)], Double($0.value)) })
        page.histogram("fcm_worker_downstream_ack_seconds", "from sending a downstream message over XMPP to CCS's answer",
                       [([], downstreamRoundTrip.withLock { $0 })])
        let journal = journalFlushes.withLock { $0 }
        page.histogram("fcm_worker_journal_flush_seconds", "journal mode: one group write and its fdatasync, before the acks of its messages",
                       [([], journal.seconds)])
        page.histogram("fcm_worker_journal_flush_messages", "journal mode: messages per group write", [([], journal.sizes)])
        page.counter("fcm_worker_journal_write_failures_total",
                     "journal mode: group writes that failed (their messages wait unacked while the write is tried again)",
                     [([], Double(journal.failures))])
        page.gauge("fcm_worker_journal_failing", "journal mode: 1 while the journal cannot be written (receiving waits)",
                   journalFailure.withLock { $0 } == nil ? 0 : 1)
        let groups = backlog.withLock { $0 }
        page.gauge("fcm_worker_outbox_rows", "outbox rows still to send (pending, retry, sending), by transport and status",
                   groups.map { ([("transport", $0.transport), ("status", $0.status)], Double($0.rows)) })
        page.gauge("fcm_worker_outbox_oldest_due_age_seconds", "how long the oldest due outbox row has waited, by transport",
                   Dictionary(grouping: groups, by: \.transport).sorted { $0.key < $1.key }
                       .map { ([("transport", $0.key)], $0.value.map(\.oldestDueAge).max() ?? 0) })
        page.gauge("fcm_worker_outbox_oldest_age_seconds",
                   "how long the oldest row not yet answered (pending, retry or sending) has been queued, by transport, due or not",
                   Dictionary(grouping: groups, by: \.transport).sorted { $0.key < $1.key }
                       .map { ([("transport", $0.key)], $0.value.map(\.oldestAge).max() ?? 0) })
        let canSend = [("xmpp", sources.openConnections() > 0), ("http", true),
                       ("v1", sources.sendableTransports.contains("v1") && sources.v1CanSend())]
        page.gauge("fcm_worker_transport_can_send",
                   "1 while a transport can send now: xmpp with a CCS session open, v1 with a service account and sending neither stopped nor held",
                   canSend.map { ([("transport", $0.0)], $0.1 ? 1 : 0) })
        page.gauge("fcm_worker_outbox_unsendable_rows",
                   "outbox rows still to send over a transport this worker cannot send (v1 without a service account), by transport",
                   Self.unsendable(groups, sendable: sources.sendableTransports).map { ([("transport", $0.transport)], Double($0.rows)) })
        page.counter("fcm_worker_outbox_stranded_rows_total",
                     "outbox rows found pending below the claim frontier, which no claim would have seen (an id taken before its transaction wrote), and queued",
                     stranded.withLock { $0 }.sorted { $0.key < $1.key }.map { ([("transport", $0.key)], Double($0.value)) })
        let v1 = v1Stopped.withLock { $0 }
        page.gauge("fcm_worker_v1_sending_stopped",
                   "1 while v1 sending is stopped because FCM answers SENDER_ID_MISMATCH for most tokens (the credentials' project is wrong)",
                   v1.now ? 1 : 0)
        page.counter("fcm_worker_v1_sender_mismatch_stops_total", "times v1 sending stopped for a sender mismatch", v1.times)

        ingress.render(into: &page)

        let pools = sources.databaseConnections()
        page.gauge("fcm_worker_database_connections", "open database connections, by pool",
                   [([("pool", "upstream")], Double(pools.upstream)), ([("pool", "outbox")], Double(pools.outbox))])
        page.counter("fcm_worker_database_errors_total", "database calls that failed because the database was unreachable or hung",
                     databaseErrors.load(ordering: .relaxed))
        page.gauge("fcm_worker_database_reachable", "1 when the last health probe reached the database", databaseReachable.load(ordering: .relaxed) ? 1 : 0)
        page.gauge("fcm_worker_ready", "1 while /readyz answers 200 (a CCS connection open, the database reachable and writable, "
                   + "the journal writable, no shutdown), checked every half second", ready.load(ordering: .relaxed) ? 1 : 0)
        page.gauge("fcm_worker_database_read_write", "1 when the server the last health probe reached takes writes (a primary, not a standby)",
                   databaseServer.withLock { $0?.readWrite ?? false } ? 1 : 0)
        return page.text
    }
}
