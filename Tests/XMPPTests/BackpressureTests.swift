import Foundation
import Synchronization
import Testing
@testable import XMPP

/// A shared, locked value for closures that outlive one scope.
final class Locked<Value: Sendable>: Sendable {
    private let mutex: Mutex<Value>
    init(_ value: Value) { mutex = Mutex(value) }
    func withLock<R: Sendable>(_ body: (inout Value) -> R) -> R { mutex.withLock { body(&$0) } }
}

private func chunk(_ size: Int) -> OutboundBuffer.Chunk { .init(bytes: [UInt8](repeating: 0x61, count: size), recordSize: 16 * 1024) }

@Suite struct OutboundBufferTests {
    @Test func sendersWaitWhenFullAndResumeInOrderAsTheThreadDrains() async throws {
        let wakes = Locked(0)
        let buffer = OutboundBuffer(capacity: 100) { wakes.withLock { $0 += 1 } }
        try await buffer.enqueue(chunk(60))
        let order = Locked<[Int]>([])
        // Two more senders: neither fits until the loop takes what is queued.
        let second = Task { try await buffer.enqueue(chunk(60)); order.withLock { $0.append(2) } }
        while buffer.waiterCount < 1 { await Task.yield() }
        let third = Task { try await buffer.enqueue(chunk(60)); order.withLock { $0.append(3) } }
        while buffer.waiterCount < 2 { await Task.yield() }
        #expect(order.withLock { $0 }.isEmpty)
        #expect(buffer.takeAll().map(\.bytes.count) == [60])   // admits the second sender only
        try await second.value
        #expect(buffer.waiterCount == 1)
        #expect(buffer.takeAll().map(\.bytes.count) == [60])   // then the third
        try await third.value
        #expect(order.withLock { $0 } == [2, 3])
        #expect(buffer.takeAll().map(\.bytes.count) == [60])
        #expect(wakes.withLock { $0 } >= 1)
    }

    @Test func aChunkLargerThanTheCapacityPassesWhenTheBufferIsEmpty() async throws {
        let buffer = OutboundBuffer(capacity: 10) {}
        try await buffer.enqueue(chunk(1000))
        #expect(buffer.takeAll().map(\.bytes.count) == [1000])
    }

    @Test func closingFailsWaitingSendersWithTheReason() async throws {
        let buffer = OutboundBuffer(capacity: 10) {}
        try await buffer.enqueue(chunk(10))
        let waiting = Task { try await buffer.enqueue(chunk(10)) }
        while buffer.waiterCount < 1 { await Task.yield() }
        buffer.close(with: .connectionLost("test"))
        await #expect(throws: XMPPError.connectionLost("test")) { try await waiting.value }
        await #expect(throws: XMPPError.connectionLost("test")) { try await buffer.enqueue(chunk(1)) }
    }

    @Test func cancellingAWaitingSenderRemovesItsChunk() async throws {
        let buffer = OutboundBuffer(capacity: 10) {}
        try await buffer.enqueue(chunk(10))
        let waiting = Task { try await buffer.enqueue(chunk(10)) }
        while buffer.waiterCount < 1 { await Task.yield() }
        waiting.cancel()
        await #expect(throws: CancellationError.self) { try await waiting.value }
        #expect(buffer.takeAll().map(\.bytes.count) == [10])
        #expect(buffer.takeAll().isEmpty)
    }
}

@Suite struct StanzaInboxTests {
    @Test func aFullInboxAsksTheReaderToPauseAndWakesItWhenDrained() async {
        let wakes = Locked(0)
        let inbox = StanzaInbox(capacity: 2) { wakes.withLock { $0 += 1 } }
        #expect(inbox.push(ReceivedStanza(element: XMLElement("a"))).hasRoom == true)
        #expect(inbox.push(ReceivedStanza(element: XMLElement("b"))).hasRoom == false)   // full: stop reading
        #expect(!inbox.hasRoom)
        #expect(await inbox.next()?.element.name == "a")
        #expect(wakes.withLock { $0 } == 1)               // the reader is woken
        #expect(inbox.hasRoom)
        inbox.finish()
        #expect(await inbox.next()?.element.name == "b")         // what was queued still comes out
        #expect(await inbox.next() == nil)
    }

    @Test func aWaitingConsumerGetsTheNextStanzaDirectly() async {
        let inbox = StanzaInbox(capacity: 1) {}
        let consumer = Task { await inbox.next()?.element.name }
        while !inbox.hasWaiter { await Task.yield() }
        #expect(inbox.push(ReceivedStanza(element: XMLElement("x"))) == .init(accepted: true, hasRoom: true))
        #expect(await consumer.value == "x")
    }

    @Test func aStoppedInboxRefusesNewStanzasButHandsOutTheQueuedOnes() async {
        let inbox = StanzaInbox(capacity: 4) {}
        inbox.push(ReceivedStanza(element: XMLElement("queued")))
        inbox.stop()
        // Refused, so never acked; what was queued (and maybe acked) still comes out.
        #expect(inbox.push(ReceivedStanza(element: XMLElement("late"))) == .init(accepted: false, hasRoom: false))
        #expect(await inbox.next()?.element.name == "queued")
        #expect(await inbox.next() == nil)
    }
}

@Suite struct StanzaInboxBatchTests {
    @Test func aBatchTakesWhatIsQueuedInOrderUpToTheMaximumAndWakesAFullReader() async {
        let wakes = Locked(0)
        let inbox = StanzaInbox(capacity: 3) { wakes.withLock { $0 += 1 } }
        for name in ["a", "b", "c", "d"] { inbox.push(ReceivedStanza(element: XMLElement(name))) }
        #expect(!inbox.hasRoom)
        #expect(await inbox.next(maximum: 3)?.map(\.element.name) == ["a", "b", "c"])
        #expect(wakes.withLock { $0 } == 1)
        inbox.finish()
        #expect(await inbox.next(maximum: 3)?.map(\.element.name) == ["d"])
        #expect(await inbox.next(maximum: 3) == nil)
    }

    @Test func aWaitingBatchConsumerIsHandedTheFirstStanzaAtOnce() async {
        let inbox = StanzaInbox(capacity: 8) {}
        let consumer = Task { await inbox.next(maximum: 100)?.map(\.element.name) }
        while !inbox.hasWaiter { await Task.yield() }
        inbox.push(ReceivedStanza(element: XMLElement("x")))
        #expect(await consumer.value == ["x"])
    }
}

@Suite struct ThreadPriorityTests {
    @Test func aThreadCanLowerItsOwnPriorityWithoutTouchingOtherThreads() async {
        let before = getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0)
        let seen = await withCheckedContinuation { (continuation: CheckedContinuation<Int32, Never>) in
            let thread = Thread {
                let raised = ThreadPriority.setCurrentThread(niceness: 7)
                continuation.resume(returning: raised ? getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0) : -100)
            }
            thread.start()
        }
        #expect(seen == 7)
        #expect(getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0) == before)
    }
}
