import XMPP

/// The worker: keeps `configuration.connections` CCS connections open and acks every
/// upstream message and receipt the moment it is parsed.
///
/// `run()` returns when its task is cancelled (each stream is closed gracefully first) and
/// throws only for configuration errors that reconnecting cannot fix.
public struct FCMWorker: Sendable {
    public let configuration: WorkerConfiguration
    public let logger: Logger
    private let observer: WorkerObserver?

    public init(configuration: WorkerConfiguration, logger: Logger = Logger(label: "fcm-worker"),
                observer: WorkerObserver? = nil) {
        self.configuration = configuration
        self.logger = logger
        self.observer = observer
    }

    /// Runs until cancelled.
    /// - Throws: `XMPPError` with `isConfigurationError` (credentials or certificate refused).
    public func run() async throws {
        ProcessSignals.ignoreSIGPIPE()
        let tls = try TLSContext.client(trust: configuration.xmppClient.trust)
        logger.info("starting: \(configuration)")
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 1...configuration.connections {
                let slot = CCSConnectionSlot(index: index, configuration: configuration, tls: tls,
                                             logger: logger.labeled("ccs#\(index)"), observer: observer)
                group.addTask { try await slot.run() }
            }
            do {
                try await group.waitForAll()
            } catch {
                group.cancelAll()
                throw error
            }
        }
        logger.info("stopped")
    }
}
