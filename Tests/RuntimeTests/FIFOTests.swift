@testable import Runtime
import Testing

@Suite struct FIFOTests {
    @Test func keepsOrderAcrossCompactionAndPrepend() {
        var fifo = FIFO<Int>()
        fifo.append(contentsOf: 0..<5000)
        var taken: [Int] = []
        while taken.count < 3000, let next = fifo.popFirst() { taken.append(next) }  // compacts on the way
        #expect(taken == Array(0..<3000))
        fifo.prepend(contentsOf: [-2, -1])
        #expect(fifo.count == 2002)
        #expect(fifo.popFirst(3) == [-2, -1, 3000])
        fifo.append(9999)
        let rest = fifo.popFirst(10_000)
        #expect(rest.first == 3001 && rest.last == 9999 && rest.count == 2000)
        #expect(fifo.isEmpty && fifo.popFirst() == nil && fifo.popFirst(5).isEmpty)
    }

    @Test func takingEverythingFromTheStartLeavesAnEmptyQueueThatKeepsWorking() {
        var fifo = FIFO<Int>()
        fifo.append(contentsOf: [1, 2, 3])
        #expect(fifo.popFirst(3) == [1, 2, 3])
        #expect(fifo.isEmpty && fifo.count == 0)
        fifo.append(4)
        #expect(fifo.popFirst(100) == [4])
        fifo.append(contentsOf: [5, 6])
        #expect(fifo.popFirst() == 5)
        #expect(fifo.popFirst(100) == [6])   // from a moved head: the copying path
        #expect(fifo.popFirst() == nil)
    }
}
