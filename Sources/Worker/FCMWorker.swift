import Foundation
import FCM
import Postgres
import XMPP
import Runtime
import Transport

/// The worker: keeps `configuration.connections` CCS connections open, acks every upstream
/// message (at once, or after its commit in durable mode), and runs the registered
/// handlers on it in PostgreSQL transactions, exactly once per message id.
///
/// `run()` returns when its task is cancelled, after a graceful shutdown: it stops
/// reading, lets queued messages commit within `shutdownTimeout`, spools what could not be
/// committed (immediate mode) to `spoolFile`, flushes acks and closes every stream. It
/// throws configuration errors that retrying cannot fix: refused credentials or
/// certificate, pending migrations, an unusable spool.
public struct FCMWorker: Sendable {
    public let configuration: WorkerConfiguration
    public let handlers: UpstreamHandlers
    public let logger: Logger
    private let observer: WorkerObserver?

    public init(configuration: WorkerConfiguration, handlers: UpstreamHandlers,
                logger: Logger = Logger(label: "fcm-worker"), observer: WorkerObserver? = nil) {
        self.configuration = configuration
        self.handlers = handlers
        self.logger = logger
        self.observer = observer
    }

    /// Runs until cancelled, then shuts down gracefully.
    public func run() async throws {
        ProcessSignals.ignoreSIGPIPE()
        let shutdown = ShutdownSignal()
        // The work runs in unstructured tasks so that cancelling `run()` starts a graceful
        // shutdown instead of interrupting every await at once.
        let work = Task { try await runUntilShutdown(shutdown) }
        try await withTaskCancellationHandler {
            try await work.value
        } onCancel: {
            shutdown.request()
        }
    }

    private func runUntilShutdown(_ shutdown: ShutdownSignal) async throws {
        guard let databaseURL = configuration.databaseURL else {
            throw ConfigurationError("missing database URL: pass --database-url or set DATABASE_URL (handlers persist into PostgreSQL)")
        }
        let tls = try TLSContext.client(trust: configuration.xmppClient.trust)
        let httpClient = try FCMHTTPClient(settings: configuration.httpClient)
        let pool = PostgresPool(conninfo: databaseURL, size: configuration.concurrency + 1,
                                preparesStatements: configuration.preparedStatements)
        logger.info("starting: \(configuration)")
        do {
            try await prepareSchema(pool, shutdown: shutdown)
            if shutdown.isRequested { await pool.close(); return }
            try await replaySpool(pool, shutdown: shutdown)
        } catch {
            await pool.close()
            throw error
        }
        if shutdown.isRequested {
            await pool.close()
            return
        }

        let pipeline = UpstreamPipeline(pool: pool, handlers: handlers, settings: configuration.pipeline,
                                        logger: logger.labeled("pipeline"), observer: observer)
        let pipelineTask = Task { await pipeline.run() }
        let senderPool = PostgresPool(conninfo: databaseURL, size: 2, preparesStatements: configuration.preparedStatements)
        let sender = OutboxSender(pool: senderPool, conninfo: databaseURL, settings: configuration.downstream,
                                  logger: logger.labeled("outbox"), observer: observer)
        let senderTask = Task { await sender.run() }
        let httpPool = PostgresPool(conninfo: databaseURL, size: 2, preparesStatements: configuration.preparedStatements)
        let httpSender = HTTPOutboxSender(pool: httpPool, client: httpClient,
                                          settings: configuration.downstream, logger: logger.labeled("http"))
        sender.alsoWake = httpSender.doorbell
        let httpTask = Task { await httpSender.run() }
        // On shutdown the sender stops first, while the connections are still read so that
        // the answers to what it sent arrive; then reading stops.
        let reading = ShutdownSignal()
        let senderWindDown = min(configuration.shutdownTimeout, .seconds(5))
        shutdown.onRequest {
            Task {
                httpSender.finish()
                await sender.finish(within: senderWindDown)
                // HTTP requests under way finish (bounded by their timeout); no more retries.
                httpTask.cancel()
                reading.request()
            }
        }
        let slots = (1...configuration.connections).map { index in
            CCSConnectionSlot(index: index, configuration: configuration, tls: tls, logger: logger.labeled("ccs#\(index)"),
                              observer: observer, pipeline: pipeline, sender: sender, shutdown: reading)
        }
        let slotsTask = Task { () -> ([XMPPConnection], (any Error)?) in
            await withTaskGroup(of: Result<[XMPPConnection], any Error>.self) { group in
                for slot in slots {
                    group.addTask {
                        do { return .success(try await slot.run()) } catch { return .failure(error) }
                    }
                }
                var open: [XMPPConnection] = []
                var failure: (any Error)?
                for await result in group {
                    switch result {
                    case .success(let connections): open += connections
                    case .failure(let error):
                        if failure == nil { failure = error }
                        shutdown.request()
                    }
                }
                return (open, failure)
            }
        }
        let (connections, failure) = await slotsTask.value
        await senderTask.value
        await httpTask.value
        await senderPool.close()
        await httpPool.close()

        // Reading has stopped. Let what is queued commit (durable acks go out meanwhile).
        logger.info("shutting down: \(pipeline.backlog) message(s) still queued")
        pipeline.close()
        let timeout = configuration.shutdownTimeout
        let deadline = Task {
            try await Task.sleep(for: timeout)
            pipeline.abandon()
        }
        let leftovers = await pipelineTask.value
        deadline.cancel()
        if !leftovers.isEmpty {
            // Work with a pending durable ack was never acked: CCS still has it.
            let acked = leftovers.filter { $0.ack == nil }
            logger.warning("\(leftovers.count) message(s) could not be committed before the shutdown deadline; "
                           + "\(acked.count) acked one(s) go to the spool \(configuration.spoolFile)")
            do {
                try Spool(path: configuration.spoolFile).append(acked.map(\.spoolEntry))
                observer?(.spooled(count: acked.count, path: configuration.spoolFile))
            } catch {
                logger.error("COULD NOT WRITE THE SPOOL \(configuration.spoolFile): \(error); \(acked.count) acked message(s) are lost: "
                             + acked.compactMap(\.messageID).joined(separator: ","))
            }
        }
        for connection in connections { await connection.close() }
        await pool.close()
        logger.info("stopped")
        if let failure { throw failure }
    }

    /// Refuses to start on pending migrations unless `migrate` is set.
    private func prepareSchema(_ pool: PostgresPool, shutdown: ShutdownSignal) async throws {
        let migrator = try Migrator(directory: configuration.migrationsDirectory)
        var delay = Duration.milliseconds(250)
        while true {
            do {
                try await pool.withConnection { connection in
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
                logger.warning("database unavailable at start (\(error.message)); retrying in \(delay.formattedSeconds)")
                observer?(.databaseUnavailable(error.message))
                await shutdown.sleep(for: delay)
                if shutdown.isRequested { return }
                delay = min(delay * 2, .seconds(10))
            }
        }
    }

    /// Persists what a previous run spooled, before reading anything new from CCS.
    private func replaySpool(_ pool: PostgresPool, shutdown: ShutdownSignal) async throws {
        let spool = Spool(path: configuration.spoolFile)
        let (entries, corrupt) = try spool.load()
        if corrupt > 0 { logger.error("\(corrupt) unreadable line(s) in the spool \(spool.path) were skipped") }
        guard !entries.isEmpty else { return }
        logger.info("replaying \(entries.count) spooled message(s) from \(spool.path)")
        let pipeline = UpstreamPipeline(pool: pool, handlers: handlers, settings: configuration.pipeline,
                                        logger: logger.labeled("spool"), observer: observer)
        shutdown.onRequest { pipeline.abandon() }
        let task = Task { await pipeline.run() }
        await pipeline.submit(entries.map(Self.work))
        pipeline.close()
        let leftovers = await task.value
        guard leftovers.isEmpty else {
            logger.warning("spool replay interrupted: \(spool.path) is kept for the next start")
            return
        }
        try spool.remove()
        observer?(.replayed(count: entries.count))
        logger.info("spool replayed and removed")
    }

    /// Rebuilds pipeline work from a spool line.
    static func work(from entry: Spool.Entry) -> UpstreamWork {
        let receivedAt = Date(timeIntervalSince1970: entry.receivedAt)
        if entry.connection != "dead-letter", case .upstream(let upstream)? = try? CCSMessage.decode(json: entry.payload),
           let messageID = upstream.messageID, let from = upstream.from {
            return UpstreamWork(kind: .message(UpstreamMessage(
                upstream, messageID: messageID, from: from, connection: "spool", receivedAt: receivedAt)))
        }
        return UpstreamWork(kind: .deadLetter(.init(rawPayload: entry.payload, reason: "unreadable",
                                                    error: "spooled without a usable message_id and from", attempts: 0, receivedAt: receivedAt)))
    }
}
