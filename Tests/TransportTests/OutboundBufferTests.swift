import Runtime
import Foundation
import Synchronization
import Testing
@testable import Transport

private func chunk(_ size: Int) -> OutboundBuffer.Chunk { .init(bytes: [UInt8](repeating: 0x61, count: size), recordSize: 16 * 1024) }

@Suite struct OutboundBufferTests {
    @Test func sendersWaitWhenFullAndResumeInOrderAsTheThreadDrains() async throws {
        let wakes = BlockingLock(0)
        let buffer = OutboundBuffer(capacity: 100) { wakes.withLock { $0 += 1 } }
        try await buffer.enqueue(chunk(60))
        let order = BlockingLock<[Int]>([])
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
        buffer.close(with: TransportError.connectionLost("test"))
        await #expect(throws: TransportError.connectionLost("test")) { try await waiting.value }
        await #expect(throws: TransportError.connectionLost("test")) { try await buffer.enqueue(chunk(1)) }
    }

    @Test func aClosedGateRefusesGatedSendersOnlyAndKeepsWhatWasQueued() async throws {
        let buffer = OutboundBuffer(capacity: 10) {}
        #expect(try await buffer.enqueueUnlessGateClosed(chunk(10)))
        let waitingGated = Task { try await buffer.enqueueUnlessGateClosed(chunk(5)) }
        while buffer.waiterCount < 1 { await Task.yield() }
        let waitingPlain = Task { try await buffer.enqueue(chunk(3)) }
        while buffer.waiterCount < 2 { await Task.yield() }
        buffer.closeGate()
        #expect(buffer.isGateClosed)
        #expect(try await waitingGated.value == false, "a gated sender waiting for room is refused")
        #expect(buffer.waiterCount == 1)
        #expect(try await buffer.enqueueUnlessGateClosed(chunk(1)) == false)
        try buffer.enqueueWithoutWaiting(chunk(2))
        // What was queued before stays, and the plain sender still gets in, behind it.
        #expect(buffer.takeAll().map(\.bytes.count) == [10, 2])
        try await waitingPlain.value
        #expect(buffer.takeAll().map(\.bytes.count) == [3])
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
