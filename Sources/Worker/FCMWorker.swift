import FCM
import Foundation
import Outbox
import Postgres
import Runtime
import Upstream
import Transport
import XMPP

/// The worker: keeps `configuration.connections` CCS connections open, acks every upstream
/// message (at once, or after its commit in durable mode), runs the registered handlers on
/// it in PostgreSQL transactions, exactly once per message id, and sends the outbox.
///
/// `run()` returns after a graceful shutdown, which `requestShutdown()` starts (the
/// `fcm-worker` command calls it on SIGTERM and SIGINT). The shutdown always ends: the outbox
/// stops claiming, waits up to 5 s (or the shutdown timeout if shorter) for the answers to
/// what it sent and hands the rest back, reading stops, queued messages commit for up to
/// `shutdownTimeout`, what was acked but not committed is spooled to `spoolFile` (the next
/// start replays it), and every stream closes. A second `requestShutdown()` skips the
/// waiting: spool and close at once.
///
/// Cancelling `run()` means "stop now", as in swift-service-lifecycle: nothing is waited for,
/// what was acked but not committed is spooled, and outbox rows under way stay claimed until
/// their lease runs out (then any worker sends them again). Nothing acked is lost either way;
/// for a clean stop, call `requestShutdown()` and await `run()`.
///
/// It throws configuration errors that retrying cannot fix: refused credentials or
/// certificate, an unknown XMPP domain, pending migrations, an unusable spool; and, after a
/// shutdown that could keep some acked messages neither in the database nor in the spool,
/// `ShutdownLoss` with their count.
public struct FCMWorker: Sendable {
    public let configuration: WorkerConfiguration
    public let handlers: UpstreamHandlers
    public let logger: Logger
    private let observer: WorkerObserver?
    private let shutdown = ShutdownSignal()
    /// Acked messages the shutdown could not keep: thrown as `ShutdownLoss` at the end.
    private let losses = ShutdownLosses()
    /// A setting found wrong while running (a transaction pooler behind a database URL
    /// that prepares statements): shuts the worker down, then thrown.
    private let misconfiguration = BlockingLock<ConfigurationError?>(nil)
    /// What `/metrics` shows (also without `--metrics-address`, for embedding applications).
    let metrics = WorkerMetrics()
    /// Reload requests (SIGHUP): v1 sending stopped for a sender mismatch resumes.
    private let reloads = ReloadGeneration()

    /// The Prometheus text `/metrics` would serve now (for applications that embed the
    /// worker and export metrics their own way, and for the benchmarks).
    public var metricsPage: String { metrics.render() }

    public init(configuration: WorkerConfiguration, handlers: UpstreamHandlers,
                logger: Logger = Logger(label: "fcm-worker"), observer: WorkerObserver? = nil) {
        self.configuration = configuration
        self.handlers = handlers
        self.logger = logger
        self.observer = observer
    }

    /// Starts the graceful shutdown; called a second time, makes it urgent (nothing more is
    /// waited for: what is uncommitted is spooled at once).
    public func requestShutdown() {
        shutdown.request()
    }

    /// Asks the worker to take its credentials again (what SIGHUP does): v1 sending stopped
    /// because FCM answered `SENDER_ID_MISMATCH` for most tokens resumes, with the service
    /// account's key file read again.
    public func reloadCredentials() {
        logger.info("reloading the credentials (SIGHUP): the service-account key file is read again for the next access token")
        reloads.request()
    }

    /// Runs until `requestShutdown()` has shut the worker down gracefully, or until cancelled,
    /// which stops it at once (see the type's documentation). Every service is a child task
    /// of the service group, told to stop by its stage's signal; cancellation reaches them all.
    public func run() async throws {
        ProcessSignals.ignoreSIGPIPE()
        try await runUntilShutdown()
    }

    private func runUntilShutdown() async throws {
        guard let databaseURL = configuration.databaseURL else {
            throw ConfigurationError("missing database URL: pass --database-url or --database-url-file, or set DATABASE_URL (handlers persist into PostgreSQL)")
        }
        let target: PostgresConnectionString
        do { target = try PostgresConnectionString(databaseURL) } catch { throw ConfigurationError(error.message) }
        let spool = Spool(path: configuration.spoolFile)
        try spool.lock()
        let tls = try TLSContext.client(trust: configuration.xmppClient.trust)
        // Without a server key (possible only without CCS) rows with transport http wait.
        let httpClient = configuration.serverKey.isEmpty ? nil : try FCMHTTPClient(settings: configuration.httpClient)
        let v1Client = try await v1Client()
        let found = foundPreparedStatementsNotKept
        func pool(size: Int) -> PostgresPool {
            PostgresPool(target: target, size: size, connectTimeout: configuration.databaseConnectTimeout,
                         callTimeout: configuration.databaseTimeout, preparesStatements: configuration.preparesStatements,
                         onPreparedStatementsNotKept: found)
        }
        let upstreamPool = pool(size: configuration.concurrency + 1)
        let outboxPool = pool(size: 3)
        logger.info("starting: \(configuration)")
        do {
            try await serve(spool: spool, tls: tls, httpClient: httpClient, v1Client: v1Client, pools: (upstreamPool, outboxPool))
        } catch {
            for pool in [upstreamPool, outboxPool] { await pool.close() }
            logger.info("stopped")
            // A setting found wrong (a transaction pooler found by the first statement at
            // start) is what the failure means: it is said rather than the statement's error.
            if let misconfiguration = misconfiguration.withLock({ $0 }) { throw misconfiguration }
            throw error
        }
        for pool in [upstreamPool, outboxPool] { await pool.close() }
        let misconfiguration = misconfiguration.withLock { $0 }
        if let loss = losses.loss {
            logger.error("stopped: \(loss)")
            throw loss
        }
        if let misconfiguration { throw misconfiguration }
        if let startup = metrics.startup.withLock({ $0 }) {
            // Asked to stop before it ever ran (a SIGTERM while the database was away at
            // start): the status is a graceful stop's, and the line says it never started.
            logger.warning("stopped before the worker started (\(startup)): nothing was received or sent")
            return
        }
        logger.info("stopped")
    }

    /// What a pool calls when PostgreSQL turns out not to keep the worker's prepared
    /// statements: the database URL is a transaction pooler, and retrying cannot help.
    /// The worker shuts down (what it acked commits or is spooled, as at any shutdown) and
    /// then exits with status 2 and the setting to use.
    private var foundPreparedStatementsNotKept: @Sendable (PostgresError) -> Void {
        { [misconfiguration, shutdown, logger] error in
            let first = misconfiguration.withLock { found -> Bool in
                guard found == nil else { return false }
                found = ConfigurationError("""
                    the database URL leads to a pooler that hands each transaction another server connection (PgBouncer's \
                    transaction mode: \(error.message)): run with --database-pooler transaction (FCM_DATABASE_POOLER=transaction) \
                    and give --database-direct-url for LISTEN and migrations, or use session pooling
                    """)
                return true
            }
            guard first else { return }
            logger.error("prepared statements are not kept between transactions (\(error.message)): shutting down; "
                         + "run with --database-pooler transaction behind a transaction pooler")
            shutdown.request()
        }
    }

    /// Serves `/metrics`, `/healthz` and `/readyz` from the first moment (readiness says
    /// what the start waits for) while the layers start and run; the observability stops
    /// last, after the layers.
    private func serve(spool: Spool, tls: TLSContext, httpClient: FCMHTTPClient?, v1Client: FCMV1Client?,
                       pools: (upstream: PostgresPool, outbox: PostgresPool)) async throws {
        let observability = ObservabilityService(metrics: metrics, address: configuration.metricsAddress, pool: pools.outbox,
                                                 shutdown: shutdown, logger: logger.labeled("metrics"), observer: observer)
        let stopObservability = ShutdownSignal()
        metrics.startup.withLock { $0 = "starting: checking the database" }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await observability.run(until: stopObservability) }
            group.addTask {
                defer { stopObservability.request() }
                try await serveLayers(spool: spool, tls: tls, httpClient: httpClient, v1Client: v1Client, pools: pools)
            }
            // The first to fail stops the other (cancelled): a metrics address that cannot be
            // bound, or a layer's failure.
            while try await group.next() != nil {}
        }
    }

    private func serveLayers(spool: Spool, tls: TLSContext, httpClient: FCMHTTPClient?, v1Client: FCMV1Client?,
                             pools: (upstream: PostgresPool, outbox: PostgresPool)) async throws {
        try await prepareSchema(pools.upstream)
        guard !shutdown.isRequested else { return }
        try await replay(spool, into: pools.upstream)
        guard !shutdown.isRequested else { return }

        let journal = configuration.ackMode == .journal
            ? UpstreamJournal(spoolPath: spool.path, niceness: configuration.ioNiceness, logger: logger.labeled("journal"),
                              observer: observer, metrics: metrics) : nil
        let pipeline = UpstreamPipeline(pool: pools.upstream, handlers: handlers, settings: configuration.pipeline,
                                        logger: logger.labeled("pipeline"), observer: observer, metrics: metrics, journal: journal)
        let observer = self.observer
        let listenTarget = try configuration.sessionDatabaseURL.map { url throws(ConfigurationError) in
            do throws(PostgresError) { return try PostgresConnectionString(url) } catch { throw ConfigurationError(error.message) }
        }
        if listenTarget == nil {
            logger.notice("behind a transaction pooler without --database-direct-url: no LISTEN, new outbox rows are found by the sweep "
                          + "every \(configuration.downstream.sweepInterval.formattedSeconds)")
        }
        let outbox = Outbox(pool: pools.outbox, listenTarget: listenTarget, client: httpClient, v1: v1Client, reloads: reloads,
                            settings: configuration.downstream,
                            logger: logger.labeled("outbox"), metrics: metrics, onListening: { observer?(.outboxListening) })
        let ccs = CCSClient(settings: configuration.ccsClient, tls: tls, journal: pipeline.journal, logger: logger, links: outbox.xmpp,
                            delegate: CCSSource(pipeline: pipeline, logger: logger, observer: observer, metrics: metrics))
        let ingress = try configuration.ingress.map { settings throws(ConfigurationError) in
            try IngressService(settings: settings, trust: configuration.caFile.map { .caFile($0) } ?? .systemDefault, pipeline: pipeline,
                               journal: journal, ackMode: configuration.ackMode, metrics: metrics.ingress, reloads: reloads,
                               observer: observer, logger: logger.labeled("ingress"))
        }
        metrics.sources.withLock { sources in
            sources.openConnections = { ccs.openCount }
            sources.windows = { outbox.xmpp.windows }
            sources.queueDepth = { pipeline.backlog }
            sources.databaseConnections = { (pools.upstream.openCount, pools.outbox.openCount) }
            sources.sendableTransports = configuration.sendableTransports
            sources.servesCCS = configuration.connections > 0
            sources.ingressUnready = { ingress?.unreadiness }
            sources.databaseReached = { pipeline.databaseAnswered() }
            sources.v1CanSend = { outbox.v1CanSend }
        }
        // Without CCS connections (--connections 0) the ingress is the only source.
        let reading: [any Service] = (configuration.connections > 0 ? [ccs.reading] : []) + (ingress.map { [$0.receiving] } ?? [])
        let streams: [any Service] = (configuration.connections > 0 ? [ccs.streams] : []) + (ingress.map { [$0.connections] } ?? [])
        let upstream = UpstreamPipelineService(pipeline: pipeline, spool: spool, shutdownTimeout: configuration.shutdownTimeout,
                                               shutdown: shutdown, logger: logger.labeled("pipeline"), observer: observer,
                                               metrics: metrics, losses: losses)
        let group = ServiceGroup(stages: [
            .init("outbox", [outbox.service(shutdownTimeout: configuration.shutdownTimeout, shutdown: shutdown)]),
            .init("reading", reading),
            .init("pipeline", [upstream]),
            // After the pipeline: the journal writes and acks what it still holds (the
            // streams are still open) and deletes the segments whose messages all
            // committed; what did not commit stays in it for the next start.
            .init("journal", journal.map { [$0] } ?? []),
            .init("streams", streams),
        ], shutdown: shutdown, logger: logger)
        metrics.startup.withLock { $0 = nil }
        try await group.run()
    }

    /// The v1 client of `--service-account-file`, its grant tried once: nil without a file.
    /// - Throws: `ServiceAccountRefused` for an unusable file or a refused grant (a token
    ///   endpoint that cannot be reached is only logged: the outbox retries).
    private func v1Client() async throws -> FCMV1Client? {
        guard let path = configuration.serviceAccountFile else { return nil }
        let client: FCMV1Client
        do {
            client = try FCMV1Client(file: try ServiceAccountFile(path: path), settings: configuration.v1Client)
        } catch let error as ServiceAccount.Invalid {
            throw ServiceAccountRefused(error.description)
        } catch {
            throw ServiceAccountRefused("the v1 client cannot be set up: \(error)")
        }
        do {
            try await client.checkCredentials()
            logger.info("v1: \(client.tokens.account) holds an access token; sending to project \(client.projectID)")
        } catch .credentials(.refused(let reason)) {
            throw ServiceAccountRefused("the token endpoint refused the grant of \(client.tokens.account): \(reason)")
        } catch {
            logger.warning("v1: no access token yet (\(error)); rows with transport v1 are tried with backoff")
        }
        return client
    }

    /// Refuses to start on pending migrations unless `migrate` is set; waits (with
    /// backoff) while the database is unreachable, until shutdown.
    private func prepareSchema(_ pool: PostgresPool) async throws {
        let migrator = try configuration.migrator()
        var outage = Backoff.outage()
        var unknownHost = 0
        while !shutdown.isRequested {
            do {
                if configuration.migrate, configuration.databasePooler == .transaction {
                    // Migrations hold a session-level lock: over a session of their own.
                    guard let url = configuration.sessionDatabaseURL else {
                        throw ConfigurationError("--migrate behind a transaction pooler needs --database-direct-url (migrations hold a session-level lock)")
                    }
                    let applied = try await PostgresConnection.withConnection(url, callTimeout: nil, preparesStatements: false) {
                        try await migrator.migrate($0)
                    }
                    if !applied.isEmpty { logger.info("applied migrations: \(applied.joined(separator: ", "))") }
                    return
                }
                try await pool.withConnection { connection in
                    let server = try await DatabaseServer.identify(on: connection)
                    guard server.readWrite else { throw StandbyReached(server: server) }
                    if configuration.migrate {
                        let applied = try await migrator.migrate(connection)
                        if !applied.isEmpty { logger.info("applied migrations: \(applied.joined(separator: ", "))") }
                    } else {
                        let pending = try await migrator.pending(connection)
                        if !pending.isEmpty {
                            throw ConfigurationError("\(pending.count) pending migration(s) (\(pending.joined(separator: ", "))): run `fcm-worker migrate` or start with --migrate")
                        }
                    }
                }
                return
            } catch let error as PostgresError where error.kind == .connection {
                if let refusal = Self.unfixableAtStart(error, unknownHostTries: &unknownHost) { throw refusal }
                let delay = outage.next()
                logger.warning("database unavailable at start (\(error.message)); retrying in \(delay.formattedSeconds)")
                metrics.startup.withLock { $0 = "starting: waiting for the database (\(error.message))" }
                observer?(.databaseUnavailable(error.message))
                await shutdown.sleep(for: delay)
            } catch let standby as StandbyReached {
                // A URL that names a standby alone (or an address that moved to one before
                // its promotion): nothing could be committed there. Wait for it to take writes.
                let delay = outage.next()
                logger.warning("the database at \(standby.server.address) is a standby in recovery (read-only): waiting for it to take writes "
                               + "(list every host in the URL with target_session_attrs=read-write); again in \(delay.formattedSeconds)")
                observer?(.databaseUnavailable("read-only standby at \(standby.server.address)"))
                await shutdown.sleep(for: delay)
            }
        }
    }

    /// How many starts in a row may find the database's host name unknown before the start
    /// gives up (a DNS record being created for a new database comes within them).
    static let unknownHostTries = 5

    /// A connection error at start that retrying cannot fix, as the configuration error to
    /// stop with (exit status 2): the server refused the credentials (a wrong password or
    /// user), the database does not exist, or the host name stayed unknown for
    /// `unknownHostTries` tries. libpq gives no SQLSTATE for a refused connection: these
    /// are read from its message and the server's, in English (a server set to another
    /// language is retried, as any other failure).
    static func unfixableAtStart(_ error: PostgresError, unknownHostTries: inout Int) -> ConfigurationError? {
        let message = error.message
        let refusals = ["password authentication failed", "no password supplied", "authentication failed for user",
                        "no pg_hba.conf entry", "role \"", "does not exist"]
        if message.contains("FATAL"), let reason = refusals.first(where: { message.contains($0) }) {
            let what = reason == "does not exist" || reason == "role \""
                ? "the database or the user named in the database URL does not exist"
                : "the database refused the credentials of the database URL"
            return ConfigurationError("\(what) (\(message)): retrying cannot fix it; check --database-url")
        }
        if message.contains("could not translate host name") {
            unknownHostTries += 1
            if unknownHostTries >= Self.unknownHostTries {
                return ConfigurationError("the database's host name is unknown after \(unknownHostTries) tries (\(message)): check --database-url")
            }
        } else {
            unknownHostTries = 0
        }
        return nil
    }

    /// The database at start is a hot standby: nothing can be committed there yet.
    private struct StandbyReached: Error {
        let server: DatabaseServer
    }

    /// Persists what a previous run spooled or journaled (journal segments are replayed
    /// whatever the ack mode now is), before reading anything new from CCS. A shutdown
    /// meanwhile keeps the files for the next start.
    private func replay(_ spool: Spool, into pool: PostgresPool) async throws {
        let files = [spool] + UpstreamJournal.segments(beside: spool.path).map { Spool(path: $0.path) }
        var entries: [Spool.Entry] = []
        for file in files {
            let (loaded, corrupt) = try file.load()
            if corrupt > 0 {
                if file !== spool {
                    logger.warning("\(corrupt) torn or corrupt record(s) in the journal segment \(file.path) were set aside in "
                                   + "\(file.path).corrupt (a record a crash tore was never acked)")
                } else {
                    logger.error("\(corrupt) torn or corrupt record(s) in the spool \(spool.path) were set aside in \(spool.path).corrupt")
                }
            }
            entries += loaded
        }
        guard !entries.isEmpty else {
            for file in files where file !== spool { try file.remove() }
            return
        }
        logger.info("replaying \(entries.count) spooled or journaled message(s) from \(spool.path)\(files.count > 1 ? " and its journal" : "")")
        let pipeline = UpstreamPipeline(pool: pool, handlers: handlers, settings: configuration.pipeline,
                                        logger: logger.labeled("spool"), observer: observer, metrics: metrics)
        // A shutdown requested meanwhile stops the replay at once: what did not commit stays.
        async let lanes = cancellingOnRequest(shutdown) { await pipeline.run() }
        await pipeline.submit(entries.map(Self.work))
        pipeline.close()
        let leftovers = await lanes
        guard leftovers.isEmpty else {
            logger.warning("replay interrupted: \(spool.path) and its journal are kept for the next start")
            return
        }
        for file in files { try file.remove() }
        metrics.replayed(entries.count)
        observer?(.replayed(count: entries.count))
        logger.info("spool and journal replayed and removed")
    }

    /// Rebuilds pipeline work from a spool line (acked before it was spooled).
    static func work(from entry: Spool.Entry) -> UpstreamWork {
        let receivedAt = Date(timeIntervalSince1970: entry.receivedAt)
        if entry.connection != "dead-letter", case .upstream(let upstream)? = try? CCSMessage.decode(json: entry.payload),
           let message = CCSUpstreamMessage(upstream, connection: "spool", receivedAt: receivedAt) {
            return UpstreamWork(kind: .message(UpstreamMessage(message)), ack: .sent)
        }
        return UpstreamWork(kind: .deadLetter(.init(rawPayload: entry.payload, reason: "unreadable",
                                                    error: "spooled without a usable message_id and from", attempts: 0,
                                                    receivedAt: receivedAt)), ack: .sent)
    }
}
