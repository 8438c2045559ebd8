@testable import Runtime
import Synchronization
import Testing

@Suite struct BoundedQueueTests {
    @Test func pushingManyFillsToCapacityThenWaitsKeepingOrder() async {
        let queue = BoundedQueue<Int>(capacity: 3)
        let pushed = Atomic(false)
        let producer = Task {
            await queue.push(contentsOf: 1...5)
            pushed.store(true, ordering: .sequentiallyConsistent)
        }
        while queue.count < 4 { await Task.yield() }   // three queued, the fourth waiting for room
        let finishedEarly = pushed.load(ordering: .sequentiallyConsistent)
        #expect(!finishedEarly)
        var taken = await queue.take(maximum: 2)
        while taken.count < 5 { taken += await queue.take(maximum: 10) }
        await producer.value
        #expect(taken == [1, 2, 3, 4, 5])
        #expect(queue.count == 0)
    }

    @Test func pushingManyQueuesBehindProducersAlreadyWaiting() async {
        let queue = BoundedQueue<Int>(capacity: 1)
        await queue.push(0)
        let first = Task { await queue.push(1) }
        while queue.count < 2 { await Task.yield() }
        let second = Task { await queue.push(contentsOf: [2, 3]) }
        while queue.count < 3 { await Task.yield() }
        var taken: [Int] = []
        while taken.count < 4 { taken += await queue.take(maximum: 10) }
        await first.value
        await second.value
        #expect(taken == [0, 1, 2, 3])
    }
}
