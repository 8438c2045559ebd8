import FCM
import Foundation
import Testing
@testable import Upstream

private struct Highest: RandomNumberGenerator {
    mutating func next() -> UInt64 { .max }
}

@Suite struct UpstreamSchedulerTests {
    private func work(_ id: String, from: String = "device") -> UpstreamWork {
        let message = UpstreamMessage(messageID: id, from: from, category: nil, rawData: [:], raw: .object([:]), rawPayload: "{}",
                                      connection: "ccs#1.1", receivedAt: Date())
        return UpstreamWork(kind: .message(message), ack: .sent)
    }

    @Test func aDeviceAlwaysTakesTheSameLaneAndDevicesSpreadOverAll() {
        var settings = PipelineSettings()
        settings.partitions = 4
        let scheduler = UpstreamScheduler(settings: settings)
        #expect(scheduler.lane(for: "device-7") == scheduler.lane(for: "device-7"))
        let lanes = Set((0..<100).map { scheduler.lane(for: "device-\($0)") })
        #expect(lanes == [0, 1, 2, 3])
        // Stable across runs and processes (FNV-1a, not Swift's seeded hashing).
        #expect(scheduler.lane(for: "a") == Int((0xaf63_dc4c_8601_ec8c as UInt64) % 4))
    }

    @Test func aLaneLingersOnlyForASmallBatchAndNeverWhileClosing() {
        let scheduler = UpstreamScheduler(settings: PipelineSettings())
        #expect(scheduler.linger(afterTaking: 10, closing: false) == .milliseconds(2))
        #expect(scheduler.linger(afterTaking: 64, closing: false) == nil)
        #expect(scheduler.linger(afterTaking: 10, closing: true) == nil)
        #expect(scheduler.linger(afterTaking: 0, closing: false) == nil)
    }

    @Test func aFailingMessageIsRetriedWithGrowingWaitsThenDeadLettered() {
        var settings = PipelineSettings()
        settings.maxAttempts = 3
        settings.retryBase = .seconds(1)
        let scheduler = UpstreamScheduler(settings: settings)
        var random = Highest()
        let now = ContinuousClock.now
        guard case .retry(let first, let firstDelay) = scheduler.failure(of: work("m"), description: "boom", permanent: false, now: now, using: &random) else {
            Issue.record("the first failure was not retried")
            return
        }
        #expect(first.attempts == 1 && firstDelay == .seconds(1) && first.retryAt == now + .seconds(1))
        guard case .retry(let second, let secondDelay) = scheduler.failure(of: first, description: "boom", permanent: false, now: now, using: &random) else {
            Issue.record("the second failure was not retried")
            return
        }
        #expect(second.attempts == 2 && secondDelay == .seconds(2))
        guard case .deadLetter(let letter) = scheduler.failure(of: second, description: "boom", permanent: false, now: now, using: &random),
              case .deadLetter(let content) = letter.kind else {
            Issue.record("the last failure was not dead-lettered")
            return
        }
        #expect(content.reason == "handler_failed" && content.attempts == 3 && content.error == "boom" && content.messageID == "m")
    }

    @Test func aPermanentFailureIsDeadLetteredAtOnce() {
        let scheduler = UpstreamScheduler(settings: PipelineSettings())
        var random = Highest()
        guard case .deadLetter(let letter) = scheduler.failure(of: work("p"), description: "never", permanent: true, now: .now, using: &random),
              case .deadLetter(let content) = letter.kind else {
            Issue.record("a permanent failure was retried")
            return
        }
        #expect(content.attempts == 1)
    }

    @Test func retriesFallDueInTimeAndAllComeBackAtShutdown() {
        let now = ContinuousClock.now
        var retries = UpstreamScheduler.Retries()
        for (id, delay) in [("late", 5), ("soon", 1), ("sooner", 0)] {
            var item = work(id)
            item.retryAt = now + .seconds(delay)
            retries.schedule(item)
        }
        #expect(retries.next == now)
        #expect(retries.takeDue(at: now + .seconds(1), maximum: 10).map(\.messageID) == ["soon", "sooner"])
        #expect(retries.next == now + .seconds(5))
        #expect(retries.takeAll().map(\.messageID) == ["late"])
        #expect(retries.isEmpty)
    }
}
