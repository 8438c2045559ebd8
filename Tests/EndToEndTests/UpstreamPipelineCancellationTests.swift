import FCM
import Foundation
import Postgres
import Runtime
import Testing
@testable import Upstream
@testable import Worker
import TestSupport

/// Handles nothing: the database is never reached in these tests.
private struct IgnoringHandler: UpstreamHandler {
    func handle(_ message: UpstreamMessage, in context: HandlerContext) async throws {}
}

/// A reading stage as a cancelled worker's can be: it hands `early` on while running, and
/// `late` once cancelled and the pipeline's lanes have given up (a reading task still
/// handing on what its connection had received and acked).
private struct LateReading: Service {
    let pipeline: UpstreamPipeline
    let early: [UpstreamWork]
    let late: [UpstreamWork]
    var name: String { "reading" }

    func run(until stop: ShutdownSignal) async {
        await pipeline.submit(early)
        await stop.wait()
        while !pipeline.hasGivenUp { await Task.yield() }
        await pipeline.submit(late)
    }
}

/// Cancelling the worker stops at once, and what was acked but not committed is spooled:
/// also what the reading hands on after the pipeline's lanes stopped.
@Suite struct UpstreamPipelineCancellationTests {
    private static func message(_ id: String) -> UpstreamWork {
        UpstreamWork(kind: .message(UpstreamMessage(from: "phone", messageID: id)), ack: .sent)
    }

    @Test func whatTheReadingHandsOnAfterTheLanesGaveUpIsSpooledWithTheRest() async throws {
        let spoolPath = NSTemporaryDirectory() + "pipeline-cancel-\(UUID().uuidString).spool"
        defer { try? FileManager.default.removeItem(atPath: spoolPath) }
        let quiet = Logger(label: "test", minimumLevel: .critical)
        let events = BlockingLock<[WorkerEvent]>([])
        let observer: WorkerObserver = { event in events.withLock { $0.append(event) } }
        var handlers = UpstreamHandlers()
        handlers.register("ignore", IgnoringHandler())
        var settings = PipelineSettings()
        settings.partitions = 1
        // Nothing listens there: every commit fails as in an outage, and the work waits.
        let pool = PostgresPool(target: try PostgresConnectionString("postgresql://fcm@127.0.0.1:1/unreachable"), size: 1)
        let pipeline = UpstreamPipeline(pool: pool, handlers: handlers, settings: settings, logger: quiet, observer: observer,
                                        metrics: WorkerMetrics())
        let shutdown = ShutdownSignal()
        let service = UpstreamPipelineService(pipeline: pipeline, spool: Spool(path: spoolPath), shutdownTimeout: .seconds(5),
                                              shutdown: shutdown, logger: quiet, observer: observer, metrics: WorkerMetrics(),
                                              losses: ShutdownLosses())
        let reading = LateReading(pipeline: pipeline, early: [Self.message("early")],
                                  late: [Self.message("late-1"), Self.message("late-2")])
        let group = ServiceGroup(stages: [.init("reading", [reading]), .init("pipeline", [service])], shutdown: shutdown, logger: quiet)
        let running = Task { try await group.run() }

        try await waitUntil("the pipeline tried to commit", within: .seconds(30)) {
            events.withLock { $0.contains { if case .databaseUnavailable = $0 { true } else { false } } }
        }
        running.cancel()
        try await running.value

        let payloads = try Spool(path: spoolPath).load().entries.map(\.payload)
        #expect(payloads.count == 3)
        for id in ["early", "late-1", "late-2"] {
            #expect(payloads.contains { $0.contains("\"message_id\":\"\(id)\"") }, "\(id) is not in the spool")
        }
        #expect(events.withLock { $0.contains { if case .spooled(3, _) = $0 { true } else { false } } })
        #expect(pipeline.backlog == 0)
    }
}
