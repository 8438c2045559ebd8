import Foundation
import Postgres
import Runtime
import Upstream
import Synchronization

/// What operators' tools see of the worker: `/metrics`, `/healthz` and `/readyz` on
/// `--metrics-address`, systemd's notifications, and the database-side gauges (the outbox
/// backlog) with the reachability probe behind `/readyz`. The last service to stop.
///
/// - `/healthz` is 200 while the worker's loops run (the cooperative pool is not stuck): a
///   supervisor restarts the process when it is not.
/// - `/readyz` is 200 while at least one CCS connection is open (without CCS: while the ingress serves), the database answered
///   the last probe (every 2 s, each given 2 s) from a server that takes writes, and no
///   shutdown was requested; its line names the server (`127.0.0.1:5432, read-write`).
struct ObservabilityService: Service {
    let metrics: WorkerMetrics
    let address: String?
    let pool: PostgresPool
    let shutdown: ShutdownSignal
    let logger: Logger
    let observer: WorkerObserver?

    var name: String { "observability" }

    /// Longer than this without a heartbeat, the worker counts as stuck.
    static let stuckAfter: Duration = .seconds(15)
    static let probeInterval: Duration = .seconds(2)
    /// How often the outbox backlog is read for `/metrics`, and only while it is served:
    /// the query counts every unfinished row (about 100 ms of the database's CPU with
    /// 240,000 of them, and 5–10 µs per message sent at the benchmark's rates when it ran
    /// with every probe), so the probes between read `SELECT 1`.
    static let backlogInterval: Duration = .seconds(10)
    /// How often rows this worker cannot send (v1 without a service account) are looked
    /// for and, while there are any, said at warning.
    static let unsendableInterval: Duration = .seconds(60)

    func run(until stop: ShutdownSignal) async throws {
        let heartbeat = Heartbeat()
        let metrics = self.metrics, shutdown = self.shutdown
        let server = try address.map { address throws(ConfigurationError) in
            try MetricsServer(address: address, routes: .init(
                metrics: { metrics.render() },
                health: {
                    let silent = Self.uptimeMilliseconds() - heartbeat.last.load(ordering: .relaxed)
                    return silent < Self.stuckAfter.milliseconds
                        ? .init(ok: true, reason: "ok")
                        : .init(ok: false, reason: "stuck: the worker's loops have not run for \(silent / 1000) s")
                },
                readiness: { Self.readiness(metrics, shutdown: shutdown) }))
        }
        if let server, let address {
            logger.info("serving /metrics, /healthz and /readyz on http://\(address.hasSuffix(":0") ? String(address.dropLast(2)) + ":\(server.port)" : address)")
            observer?(.serving(metricsPort: server.port))
        }
        let notifier = SystemdNotifier()
        // Served and probed until its stage stops.
        await cancellingOnRequest(stop) { [self] in
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await probe() }
                group.addTask {
                    var ready = false
                    var lastWatchdog = ContinuousClock.now
                    while !Task.isCancelled {
                        heartbeat.last.store(Self.uptimeMilliseconds(), ordering: .relaxed)
                        let readyNow = Self.readiness(metrics, shutdown: shutdown).ok
                        metrics.ready.store(readyNow, ordering: .relaxed)
                        if !ready && readyNow {
                            ready = true
                            notifier.notify("READY=1\nSTATUS=connected to CCS, database reachable")
                        }
                        if let interval = notifier.watchdogInterval, ContinuousClock.now - lastWatchdog >= interval {
                            notifier.notify("WATCHDOG=1")
                            lastWatchdog = .now
                        }
                        guard await sleepUnlessCancelled(for: .milliseconds(500)) else { break }
                    }
                }
                await group.waitForAll()
            }
        }
        notifier.notify("STOPPING=1")
        server?.stop()
    }

    /// Probes the database every `probeInterval` (its answer is the database's
    /// reachability): with the outbox backlog when `/metrics` is served and the last one
    /// is `backlogInterval` old, otherwise with `SELECT 1`.
    private func probe() async {
        /// What one probe learnt.
        enum Answer: Sendable {
            case unreachable
            case reached(DatabaseServer)
            case backlog([WorkerMetrics.Backlog], DatabaseServer)
        }
        var backlogReadAt: ContinuousClock.Instant?
        var unsendableCheckedAt: ContinuousClock.Instant?
        while !Task.isCancelled {
            let now = ContinuousClock.now
            // Known once the layers are built (the probes start before them).
            let sendable = metrics.sources.withLock { $0.sendableTransports }
            let checksUnsendable = sendable.count < WorkerMetrics.transports.count
            let unsendableDue = checksUnsendable && unsendableCheckedAt.map { now - $0 >= Self.unsendableInterval } ?? checksUnsendable
            let readsBacklog = unsendableDue || (address != nil && backlogReadAt.map { now - $0 >= Self.backlogInterval } ?? true)
            let answer = await withTaskGroup(of: Answer.self) { group in
                group.addTask {
                    do {
                        return try await pool.withConnection { connection -> Answer in
                            let server = try await DatabaseServer.identify(on: connection)
                            guard readsBacklog else { return .reached(server) }
                            return .backlog(try await Self.backlog(on: connection), server)
                        }
                    } catch {
                        return .unreachable
                    }
                }
                group.addTask {
                    // No answer within the interval counts as unreachable.
                    _ = await sleepUnlessCancelled(for: Self.probeInterval)
                    return .unreachable
                }
                let first = await group.next() ?? .unreachable
                group.cancelAll()
                return first
            }
            switch answer {
            case .unreachable: metrics.databaseReachable.store(false, ordering: .relaxed)
            case .reached(let server):
                metrics.databaseServer.withLock { $0 = server }
                metrics.databaseReachable.store(true, ordering: .relaxed)
                metrics.sources.withLock { $0.databaseReached }()
            case .backlog(let backlog, let server):
                metrics.databaseServer.withLock { $0 = server }
                metrics.databaseReachable.store(true, ordering: .relaxed)
                metrics.sources.withLock { $0.databaseReached }()
                metrics.backlog.withLock { $0 = backlog }
                backlogReadAt = now
                if unsendableDue {
                    unsendableCheckedAt = now
                    warnOfUnsendableRows(backlog, sendable: sendable)
                }
            }
            guard await sleepUnlessCancelled(for: Self.probeInterval) else { return }
        }
    }

    /// Says at warning which rows wait for a transport this worker cannot send.
    private func warnOfUnsendableRows(_ backlog: [WorkerMetrics.Backlog], sendable: Set<String>) {
        for (transport, rows) in WorkerMetrics.unsendable(backlog, sendable: sendable) where rows > 0 {
            let missing = transport == "v1" ? "no service account (--service-account-file or GOOGLE_APPLICATION_CREDENTIALS)" : "no credentials for it"
            logger.warning("\(rows) outbox row(s) with transport \(transport) wait: this worker cannot send them (\(missing)); "
                           + "give it one and restart, or run a worker that has one")
        }
    }

    static func backlog(on connection: PostgresConnection) async throws -> [WorkerMetrics.Backlog] {
        try await connection.query("""
            SELECT transport, status, count(*)::bigint,
                   coalesce(extract(epoch FROM now() - min(available_at) FILTER (WHERE due)), 0)::float8,
                   coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
            FROM downstream_messages_open_shown WHERE available_at IS NOT NULL GROUP BY 1, 2 ORDER BY 1, 2
            """).map { row in
            WorkerMetrics.Backlog(transport: row.string(0) ?? "", status: row.string(1) ?? "", rows: Int(row.int(2) ?? 0),
                                  oldestDueAge: row.double(3) ?? 0, oldestAge: row.double(4) ?? 0)
        }
    }

    static func readiness(_ metrics: WorkerMetrics, shutdown: ShutdownSignal) -> MetricsServer.Probe {
        if shutdown.isRequested { return .init(ok: false, reason: "not ready: shutting down") }
        if let startup = metrics.startup.withLock({ $0 }) { return .init(ok: false, reason: "not ready: \(startup)") }
        let sources = metrics.sources.withLock { $0 }
        let open = sources.openConnections()
        if sources.servesCCS {
            guard open > 0 else { return .init(ok: false, reason: "not ready: no CCS connection is open") }
        }
        // With the ingress, whatever else runs: a load balancer sends devices only where they are served.
        if let unready = sources.ingressUnready() { return .init(ok: false, reason: "not ready: \(unready)") }
        guard metrics.databaseReachable.load(ordering: .relaxed) else {
            return .init(ok: false, reason: "not ready: the database did not answer the last probe")
        }
        let server = metrics.databaseServer.withLock { $0 }
        if let server, !server.readWrite {
            return .init(ok: false, reason: "not ready: the database at \(server.address) is a standby in recovery (read-only); "
                                            + "list every host in the URL with target_session_attrs=read-write")
        }
        if let failure = metrics.journalFailure.withLock({ $0 }) {
            return .init(ok: false, reason: "not ready: the journal cannot be written (\(failure)); messages wait unacked")
        }
        let source = sources.servesCCS ? "\(open) CCS connection(s) open" : "the HTTPS ingress serving"
        return .init(ok: true, reason: "ready: \(source), database \(server?.description ?? "reachable")")
    }

    /// When the worker's loop last ran (monotonic milliseconds).
    private final class Heartbeat: Sendable {
        let last = Atomic<Int64>(ObservabilityService.uptimeMilliseconds())
    }

    fileprivate static func uptimeMilliseconds() -> Int64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return Int64(time.tv_sec) * 1000 + Int64(time.tv_nsec) / 1_000_000
    }
}

extension Duration {
    /// Whole milliseconds.
    var milliseconds: Int64 { components.seconds * 1000 + components.attoseconds / 1_000_000_000_000_000 }
}
