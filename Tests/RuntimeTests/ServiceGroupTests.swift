@testable import Runtime
import Synchronization
import Testing

/// Records when it started and stopped, and takes `windDown` to stop once told to (a
/// cancellation cuts the wind-down short).
private struct RecordingService: Service {
    let name: String
    let journal: Journal
    var windDown: Duration = .zero
    var failure: (any Error)? = nil

    func run(until stop: ShutdownSignal) async throws {
        journal.append("\(name) started")
        if let failure { throw failure }
        await stop.wait()
        journal.append("\(name) \(Task.isCancelled ? "cancelled" : "told to stop")")
        let until = ContinuousClock.now + windDown
        while ContinuousClock.now < until && !Task.isCancelled { await Task.yield() }
        journal.append("\(name) stopped\(Task.isCancelled ? " at once" : "")")
    }
}

private final class Journal: Sendable {
    private let entries = BlockingLock<[String]>([])
    func append(_ entry: String) { entries.withLock { $0.append(entry) } }
    var all: [String] { entries.withLock { $0 } }
}

private struct Planned: Error {}

@Suite struct ServiceGroupTests {
    private func quiet() -> Logger { Logger(label: "test", minimumLevel: .error) { _ in } }

    @Test func stagesStopInTheDeclaredOrderEachAfterTheOneBefore() async throws {
        let journal = Journal()
        let shutdown = ShutdownSignal()
        let group = ServiceGroup(stages: [
            .init("first", [RecordingService(name: "a", journal: journal, windDown: .milliseconds(50)),
                            RecordingService(name: "b", journal: journal)]),
            .init("second", [RecordingService(name: "c", journal: journal, windDown: .milliseconds(20))]),
            .init("third", [RecordingService(name: "d", journal: journal)]),
        ], shutdown: shutdown, logger: quiet())
        let running = Task { try await group.run() }
        while journal.all.filter({ $0.hasSuffix("started") }).count < 4 { await Task.yield() }
        #expect(!journal.all.contains { $0.hasSuffix("told to stop") })
        shutdown.request()
        try await running.value
        let order = journal.all.filter { !$0.hasSuffix("started") }
        func position(_ entry: String) -> Int { order.firstIndex(of: entry) ?? -1 }
        // Each stage is told to stop only after every service of the stage before it
        // stopped, and none is cancelled: a graceful stop is not a cancellation.
        #expect(position("c told to stop") > position("a stopped"))
        #expect(position("c told to stop") > position("b stopped"))
        #expect(position("d told to stop") > position("c stopped"))
        #expect(order.count == 8 && !order.contains { $0.hasSuffix("cancelled") || $0.hasSuffix("at once") }, "\(order)")
    }

    @Test func cancellingTheGroupStopsEveryServiceAtOnce() async throws {
        let journal = Journal()
        let shutdown = ShutdownSignal()
        let group = ServiceGroup(stages: [
            .init("first", [RecordingService(name: "a", journal: journal, windDown: .seconds(600))]),
            .init("second", [RecordingService(name: "b", journal: journal, windDown: .seconds(600))]),
        ], shutdown: shutdown, logger: quiet())
        let running = Task { try await group.run() }
        while journal.all.filter({ $0.hasSuffix("started") }).count < 2 { await Task.yield() }
        running.cancel()
        try await running.value
        // Both end, neither waiting for its ten-minute wind-down.
        #expect(Set(journal.all.filter { $0.hasPrefix("a stopped") || $0.hasPrefix("b stopped") }) == ["a stopped at once", "b stopped at once"])
    }

    @Test func cancelledAStagesStopStillComesOnlyAfterTheStagesBeforeItReturned() async throws {
        let journal = Journal()
        let shutdown = ShutdownSignal()
        // Cancelled, "a" returns only once "b" waits for its stop regardless of the
        // cancellation (as a reading task still handing on what it holds would).
        struct Lingering: Service {
            let journal: Journal
            var name: String { "a" }
            func run(until stop: ShutdownSignal) async {
                journal.append("a started")
                await stop.wait()
                while !journal.all.contains("b cancelled") { await Task.yield() }
                journal.append("a returned")
            }
        }
        struct Waiting: Service {
            let journal: Journal
            var name: String { "b" }
            func run(until stop: ShutdownSignal) async {
                journal.append("b started")
                await stop.wait()
                journal.append(Task.isCancelled ? "b cancelled" : "b told to stop")
                await stop.waitIgnoringCancellation()
                journal.append("b stop requested")
            }
        }
        let group = ServiceGroup(stages: [.init("first", [Lingering(journal: journal)]), .init("second", [Waiting(journal: journal)])],
                                 shutdown: shutdown, logger: quiet())
        let running = Task { try await group.run() }
        while journal.all.filter({ $0.hasSuffix("started") }).count < 2 { await Task.yield() }
        running.cancel()
        try await running.value
        let order = journal.all
        #expect(order.contains("b cancelled"))
        #expect((order.firstIndex(of: "a returned") ?? .max) < (order.firstIndex(of: "b stop requested") ?? -1), "\(order)")
    }

    @Test func aPartRunUnderASignalIsCancelledWhenItIsRequestedAndItsResultKept() async {
        let stop = ShutdownSignal()
        let started = ShutdownSignal()
        let part = Task {
            await cancellingOnRequest(stop) { () async -> String in
                started.request()
                let finished = await sleepUnlessCancelled(for: .seconds(600))
                return finished ? "slept" : "cancelled"
            }
        }
        await started.wait()
        stop.request()
        #expect(await part.value == "cancelled")
        // A part that ends by itself returns its result; the signal is not needed.
        #expect(await cancellingOnRequest(ShutdownSignal()) { 42 } == 42)
    }

    @Test func aServiceThatThrowsStopsTheGroupAndItsErrorComesOut() async {
        let journal = Journal()
        let shutdown = ShutdownSignal()
        let group = ServiceGroup(stages: [
            .init("first", [RecordingService(name: "a", journal: journal)]),
            .init("second", [RecordingService(name: "b", journal: journal, failure: Planned())]),
        ], shutdown: shutdown, logger: quiet())
        await #expect(throws: Planned.self) { try await group.run() }
        #expect(shutdown.isRequested)
        #expect(journal.all.contains("a stopped"))
    }
}

@Suite struct CancellableWaitTests {
    @Test func aProducerCancelledWhileWaitingForRoomHandsItsItemsOverAnyway() async {
        let queue = BoundedQueue<Int>(capacity: 2)
        await queue.push(contentsOf: [1, 2])
        let producer = Task { await queue.push(contentsOf: [3, 4]) }
        while queue.count < 3 { await Task.yield() }
        producer.cancel()
        await producer.value
        #expect(queue.count == 4, "nothing a producer held is lost")
        #expect(await queue.take(maximum: 10) == [1, 2, 3, 4])
    }

    @Test func takingEverythingReleasesWaitingProducersWithTheirItems() async {
        let queue = BoundedQueue<Int>(capacity: 1)
        await queue.push(1)
        let producer = Task { await queue.push(contentsOf: [2, 3]) }
        while queue.count < 2 { await Task.yield() }
        let everything = queue.takeAll()
        await producer.value
        // The producer's remaining item is accepted without waiting once the queue is drained.
        #expect(everything + queue.takeAll() == [1, 2, 3])
        #expect(queue.isClosed)
    }

    @Test func aConsumerWaitEndsOnCancellationAndOnItsDeadline() async {
        let queue = BoundedQueue<Int>(capacity: 1)
        let consumer = Task { await queue.take(maximum: 1) }
        consumer.cancel()
        #expect(await consumer.value == [])
        let started = ContinuousClock.now
        #expect(await queue.take(maximum: 1, deadline: .now + .milliseconds(30)) == [])
        #expect(ContinuousClock.now - started >= .milliseconds(30))
    }

    @Test func doorbellShutdownAndOneShotWaitsEndOnCancellation() async {
        let doorbell = Doorbell()
        let ringing = Task { await doorbell.wait(timeout: .seconds(600)) }
        ringing.cancel()
        await ringing.value
        let shutdown = ShutdownSignal()
        let sleeping = Task { await shutdown.sleep(for: .seconds(600)) }
        sleeping.cancel()
        await sleeping.value
        let waiting = Task { await shutdown.wait() }
        waiting.cancel()
        await waiting.value
        let value = OneShot<Int>()
        let awaiting = Task { try await value.value() }
        awaiting.cancel()
        await #expect(throws: CancellationError.self) { try await awaiting.value }
    }

    @Test func aSecondRequestMakesTheShutdownUrgent() async {
        let shutdown = ShutdownSignal()
        let urgent = Task { await shutdown.waitUntilUrgent() }
        shutdown.request()
        #expect(shutdown.isRequested && !shutdown.isUrgent)
        shutdown.request()
        await urgent.value
        #expect(shutdown.isUrgent)
    }

    @Test func aRingBeforeTheWaitIsKept() async {
        let doorbell = Doorbell()
        doorbell.ring()
        let started = ContinuousClock.now
        await doorbell.wait(timeout: .seconds(600))
        #expect(ContinuousClock.now - started < .seconds(60))
    }
}
