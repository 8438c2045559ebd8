
/// Runs services together until shutdown, then stops them in a declared order.
///
/// The stages are listed in stopping order: on shutdown the first stage's services are told
/// to stop (their `stop` signal, not cancellation) and awaited, then the second stage's, and
/// so on. Every service runs as a child task of the group's `run()`: cancelling that stops
/// every service at once, and each stage's `stop` is still requested only once the earlier
/// stages have returned (a service may wait for it to know that they are done). A later
/// stage keeps running while an earlier one winds down, which is the point: the worker's
/// outbox stops claiming while its CCS connections are still read (their answers arrive),
/// reading stops while the pipeline still commits, and the streams close last (after the
/// acks of what committed). A service that throws requests shutdown for everyone; the first such
/// error is rethrown once every stage has stopped.
package struct ServiceGroup: Sendable {
    /// Services that stop together.
    package struct Stage: Sendable {
        package let name: String
        package let services: [any Service]

        package init(_ name: String, _ services: [any Service]) {
            self.name = name
            self.services = services
        }
    }

    package let stages: [Stage]
    private let shutdown: ShutdownSignal
    private let logger: Logger

    /// - Parameter stages: in the order they stop on shutdown.
    package init(stages: [Stage], shutdown: ShutdownSignal, logger: Logger) {
        self.stages = stages
        self.shutdown = shutdown
        self.logger = logger
    }

    /// Runs every service until `shutdown` is requested (or a service throws), then stops
    /// the stages in order; returns when all have stopped.
    /// - Throws: the first error a service threw.
    package func run() async throws {
        let failure = BlockingLock<(any Error)?>(nil)
        await run(stages[...], failure: failure)
        if let error = failure.withLock({ $0 }) { throw error }
    }

    /// The last stage runs outermost, so that it is cancelled last: each level starts its
    /// stage's services, runs the earlier stages inside, and stops its own once those
    /// have stopped.
    private func run(_ stages: ArraySlice<Stage>, failure: BlockingLock<(any Error)?>) async {
        guard let stage = stages.last else {
            await shutdown.wait()
            return
        }
        let stop = ShutdownSignal()
        await withTaskGroup(of: Void.self) { group in
            for service in stage.services {
                group.addTask { [shutdown, logger] in
                    do {
                        try await service.run(until: stop)
                    } catch is CancellationError {
                    } catch {
                        logger.error("\(service.name) stopped: \(error)")
                        failure.withLock { if $0 == nil { $0 = error } }
                        shutdown.request()
                    }
                }
            }
            // A service that ends early without an error (nothing more to do) is fine; the
            // stage waits for the others.
            await run(stages.dropLast(), failure: failure)
            logger.debug("stopping \(stage.name)")
            stop.request()
            await group.waitForAll()
        }
    }
}
