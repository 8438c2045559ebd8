import Runtime
import Foundation
import Synchronization
import Testing
@testable import XMPP

/// A shared, locked value for closures that outlive one scope.
final class Locked<Value: Sendable>: Sendable {
    private let mutex: BlockingLock<Value>
    init(_ value: Value) { mutex = BlockingLock(value) }
    func withLock<R: Sendable>(_ body: (inout Value) -> R) -> R { mutex.withLock { body(&$0) } }
}

@Suite struct StanzaInboxTests {
    @Test func aFullInboxAsksTheReaderToPauseAndWakesItWhenDrained() async {
        let wakes = Locked(0)
        let inbox = StanzaInbox(capacity: 2) { wakes.withLock { $0 += 1 } }
        #expect(inbox.push(InboundBox(XMLElement("a"))).hasRoom == true)
        #expect(inbox.push(InboundBox(XMLElement("b"))).hasRoom == false)   // full: stop reading
        #expect(!inbox.hasRoom)
        #expect(await inbox.next().flatMap { ($0 as? InboundBox<XMLElement>)?.value }?.name == "a")
        #expect(wakes.withLock { $0 } == 1)               // the reader is woken
        #expect(inbox.hasRoom)
        inbox.finish()
        #expect(await inbox.next().flatMap { ($0 as? InboundBox<XMLElement>)?.value }?.name == "b")         // what was queued still comes out
        #expect(await inbox.next() == nil)
    }

    @Test func aWaitingConsumerGetsTheNextStanzaDirectly() async {
        let inbox = StanzaInbox(capacity: 1) {}
        let consumer = Task { await inbox.next().flatMap { ($0 as? InboundBox<XMLElement>)?.value }?.name }
        while !inbox.hasWaiter { await Task.yield() }
        #expect(inbox.push(InboundBox(XMLElement("x"))) == .init(accepted: true, hasRoom: true))
        #expect(await consumer.value == "x")
    }

    /// Interception and queueing are one step with respect to `stop()`: a stanza is either
    /// intercepted and handed out, or (after `stop()`) not intercepted at all. Journal mode
    /// journals, and so acks, in its interception: one intercepted, then refused by a stop
    /// in between, was acked and never handled.
    @Test func aStanzaIsInterceptedOnlyIfItIsHandedOut() async {
        let inbox = StanzaInbox(capacity: 4) {}
        let intercepted = Locked<[String]>([])
        #expect(inbox.push { intercepted.withLock { $0.append("first") }; return InboundBox(XMLElement("first")) }?.accepted == true)
        inbox.stop()
        #expect(inbox.push { intercepted.withLock { $0.append("late") }; return InboundBox(XMLElement("late")) } == nil)
        #expect(intercepted.withLock { $0 } == ["first"], "nothing is intercepted after stop()")
        #expect(await inbox.next().flatMap { ($0 as? InboundBox<XMLElement>)?.value }?.name == "first")
        #expect(await inbox.next() == nil)
    }

    @Test func aStoppedInboxRefusesNewStanzasButHandsOutTheQueuedOnes() async {
        let inbox = StanzaInbox(capacity: 4) {}
        inbox.push(InboundBox(XMLElement("queued")))
        inbox.stop()
        // Refused, so never acked; what was queued (and maybe acked) still comes out.
        #expect(inbox.push(InboundBox(XMLElement("late"))) == .init(accepted: false, hasRoom: false))
        #expect(await inbox.next().flatMap { ($0 as? InboundBox<XMLElement>)?.value }?.name == "queued")
        #expect(await inbox.next() == nil)
    }
}

@Suite struct StanzaInboxBatchTests {
    @Test func aBatchTakesWhatIsQueuedInOrderUpToTheMaximumAndWakesAFullReader() async {
        let wakes = Locked(0)
        let inbox = StanzaInbox(capacity: 3) { wakes.withLock { $0 += 1 } }
        for name in ["a", "b", "c", "d"] { inbox.push(InboundBox(XMLElement(name))) }
        #expect(!inbox.hasRoom)
        #expect(await inbox.next(maximum: 3)?.compactMap { ($0 as? InboundBox<XMLElement>)?.value.name } == ["a", "b", "c"])
        #expect(wakes.withLock { $0 } == 1)
        inbox.finish()
        #expect(await inbox.next(maximum: 3)?.compactMap { ($0 as? InboundBox<XMLElement>)?.value.name } == ["d"])
        #expect(await inbox.next(maximum: 3) == nil)
    }

    @Test func aWaitingBatchConsumerIsHandedTheFirstStanzaAtOnce() async {
        let inbox = StanzaInbox(capacity: 8) {}
        let consumer = Task { await inbox.next(maximum: 100)?.compactMap { ($0 as? InboundBox<XMLElement>)?.value.name } }
        while !inbox.hasWaiter { await Task.yield() }
        inbox.push(InboundBox(XMLElement("x")))
        #expect(await consumer.value == ["x"])
    }

    /// The stanzas of one read reach a waiting consumer in one resumption, at `handOver()`
    /// (the reader's end of a read), up to the consumer's maximum; the rest stay queued.
    @Test func aWaitingConsumerIsResumedOncePerReadWithItsStanzas() async {
        let inbox = StanzaInbox(capacity: 8) {}
        let consumer = Task { await inbox.next(maximum: 3)?.compactMap { ($0 as? InboundBox<XMLElement>)?.value.name } }
        while !inbox.hasWaiter { await Task.yield() }
        for name in ["a", "b", "c", "d"] { #expect(inbox.push { InboundBox(XMLElement(name)) }?.accepted == true) }
        #expect(inbox.hasWaiter, "nothing is handed over before the read ends")
        inbox.handOver()
        #expect(await consumer.value == ["a", "b", "c"])
        #expect(await inbox.next(maximum: 3)?.compactMap { ($0 as? InboundBox<XMLElement>)?.value.name } == ["d"])
    }

    /// A stream that ends right after a read still hands its stanzas to a waiting consumer
    /// before the end (they may have been acked).
    @Test func theEndOfTheStreamHandsOverWhatIsQueuedFirst() async {
        for ending in ["finish", "stop"] {
            let inbox = StanzaInbox(capacity: 8) {}
            let consumer = Task { () -> [String?] in
                var names: [String?] = []
                while let batch = await inbox.next(maximum: 10) { names += batch.map { ($0 as? InboundBox<XMLElement>)?.value.name } }
                return names
            }
            while !inbox.hasWaiter { await Task.yield() }
            _ = inbox.push { InboundBox(XMLElement("acked")) }
            if ending == "finish" { inbox.finish() } else { inbox.stop() }
            #expect(await consumer.value == ["acked"], "\(ending)")
        }
    }
}

@Suite struct StanzaInboxCancellationTests {
    @Test func aConsumerCancelledWhileNothingIsQueuedGetsNil() async {
        let inbox = StanzaInbox(capacity: 2) {}
        let consumer = Task { await inbox.next(maximum: 10) }
        while !inbox.hasWaiter { await Task.yield() }
        consumer.cancel()
        #expect(await consumer.value == nil)
        // What arrives later is still there for the next consumer.
        inbox.push(InboundBox(XMLElement("later")))
        #expect(await inbox.next().flatMap { ($0 as? InboundBox<XMLElement>)?.value }?.name == "later")
    }
}
