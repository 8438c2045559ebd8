import Runtime
import Foundation
import Synchronization
import Testing
@testable import XMPP

/// A stanza inbox as its stream's thread and its consumer use it.
private extension StanzaInbox {
    convenience init(capacity: Int, onRoom: @escaping @Sendable () -> Void = {}) {
        self.init(capacity: capacity, onRoom: Optional(onRoom))
    }

    /// One stanza named `name`, offered and handed over as a read of one stanza is.
    @discardableResult
    func offerAndHandOver(_ name: String) -> BoundedQueueOffer {
        let offered = offer { InboundBox(XMLElement(name)) }
        handOver()
        return offered
    }

    /// The names of the next batch, nil at the end (as `XMPPConnection.next(maximum:)`).
    func nextNames(maximum: Int = 1) async -> [String]? {
        let items = await take(maximum: maximum)
        return items.isEmpty ? nil : items.map { ($0 as? InboundBox<XMLElement>)?.value.name ?? "?" }
    }
}

@Suite struct StanzaInboxTests {
    @Test func aFullInboxAsksTheReaderToPauseAndWakesItWhenDrained() async {
        let wakes = BlockingLock(0)
        let inbox = StanzaInbox(capacity: 2) { wakes.withLock { $0 += 1 } }
        #expect(inbox.offerAndHandOver("a") == .queued(hasRoom: true))
        #expect(inbox.offerAndHandOver("b") == .queued(hasRoom: false))   // full: stop reading
        #expect(!inbox.hasRoom)
        #expect(await inbox.nextNames() == ["a"])
        #expect(wakes.withLock { $0 } == 1)               // the reader is woken
        #expect(inbox.hasRoom)
        inbox.close()
        #expect(await inbox.nextNames() == ["b"])         // what was queued still comes out
        #expect(await inbox.nextNames() == nil)
    }

    @Test func aWaitingConsumerGetsTheNextStanzaDirectly() async {
        let inbox = StanzaInbox(capacity: 1)
        let consumer = Task { await inbox.nextNames() }
        while !inbox.hasWaitingConsumer { await Task.yield() }
        #expect(inbox.offerAndHandOver("x") == .queued(hasRoom: false))
        #expect(await consumer.value == ["x"])
    }

    /// Interception and queueing are one step with respect to stopping: a stanza is either
    /// intercepted and handed out, or (after `close(refusingOffers: true)`) not intercepted
    /// at all. Journal mode journals, and so acks, in its interception: one intercepted,
    /// then refused by a stop in between, was acked and never handled.
    @Test func aStanzaIsInterceptedOnlyIfItIsHandedOut() async {
        let inbox = StanzaInbox(capacity: 4)
        let intercepted = BlockingLock<[String]>([])
        #expect(inbox.offer { intercepted.withLock { $0.append("first") }; return InboundBox(XMLElement("first")) } != .refused)
        inbox.close(refusingOffers: true)
        #expect(inbox.offer { intercepted.withLock { $0.append("late") }; return InboundBox(XMLElement("late")) } == .refused)
        #expect(intercepted.withLock { $0 } == ["first"], "nothing is intercepted after the stop")
        #expect(await inbox.nextNames() == ["first"])
        #expect(await inbox.nextNames() == nil)
    }

    @Test func aStoppedInboxRefusesNewStanzasButHandsOutTheQueuedOnes() async {
        let inbox = StanzaInbox(capacity: 4)
        inbox.offerAndHandOver("queued")
        inbox.close(refusingOffers: true)
        // Refused, so never acked; what was queued (and maybe acked) still comes out.
        #expect(inbox.offerAndHandOver("late") == .refused)
        #expect(!inbox.hasRoom)
        #expect(await inbox.nextNames() == ["queued"])
        #expect(await inbox.nextNames() == nil)
    }
}

@Suite struct StanzaInboxBatchTests {
    @Test func aBatchTakesWhatIsQueuedInOrderUpToTheMaximumAndWakesAFullReader() async {
        let wakes = BlockingLock(0)
        let inbox = StanzaInbox(capacity: 3) { wakes.withLock { $0 += 1 } }
        for name in ["a", "b", "c", "d"] { inbox.offerAndHandOver(name) }
        #expect(!inbox.hasRoom)
        #expect(await inbox.nextNames(maximum: 3) == ["a", "b", "c"])
        #expect(wakes.withLock { $0 } == 1)
        inbox.close()
        #expect(await inbox.nextNames(maximum: 3) == ["d"])
        #expect(await inbox.nextNames(maximum: 3) == nil)
    }

    @Test func aWaitingBatchConsumerIsHandedTheFirstStanzaAtOnce() async {
        let inbox = StanzaInbox(capacity: 8)
        let consumer = Task { await inbox.nextNames(maximum: 100) }
        while !inbox.hasWaitingConsumer { await Task.yield() }
        inbox.offerAndHandOver("x")
        #expect(await consumer.value == ["x"])
    }

    /// The stanzas of one read reach a waiting consumer in one resumption, at `handOver()`
    /// (the reader's end of a read), up to the consumer's maximum; the rest stay queued.
    @Test func aWaitingConsumerIsResumedOncePerReadWithItsStanzas() async {
        let inbox = StanzaInbox(capacity: 8)
        let consumer = Task { await inbox.nextNames(maximum: 3) }
        while !inbox.hasWaitingConsumer { await Task.yield() }
        for name in ["a", "b", "c", "d"] { #expect(inbox.offer { InboundBox(XMLElement(name)) } != .refused) }
        #expect(inbox.hasWaitingConsumer, "nothing is handed over before the read ends")
        inbox.handOver()
        #expect(await consumer.value == ["a", "b", "c"])
        #expect(await inbox.nextNames(maximum: 3) == ["d"])
    }

    /// A read that completed no stanza does not wake the consumer.
    @Test func aReadWithoutStanzasLeavesTheConsumerWaiting() async {
        let inbox = StanzaInbox(capacity: 8)
        let consumer = Task { await inbox.nextNames(maximum: 3) }
        while !inbox.hasWaitingConsumer { await Task.yield() }
        #expect(inbox.offer { nil } == .queued(hasRoom: true))
        inbox.handOver()
        #expect(inbox.hasWaitingConsumer)
        inbox.offerAndHandOver("a")
        #expect(await consumer.value == ["a"])
    }

    /// A stream that ends right after a read still hands its stanzas to a waiting consumer
    /// before the end (they may have been acked).
    @Test func theEndOfTheStreamHandsOverWhatIsQueuedFirst() async {
        for refusing in [false, true] {
            let inbox = StanzaInbox(capacity: 8)
            let consumer = Task { () -> [String] in
                var names: [String] = []
                while let batch = await inbox.nextNames(maximum: 10) { names += batch }
                return names
            }
            while !inbox.hasWaitingConsumer { await Task.yield() }
            _ = inbox.offer { InboundBox(XMLElement("acked")) }
            inbox.close(refusingOffers: refusing)
            #expect(await consumer.value == ["acked"], "refusing offers: \(refusing)")
        }
    }
}

@Suite struct StanzaInboxCancellationTests {
    @Test func aConsumerCancelledWhileNothingIsQueuedGetsNil() async {
        let inbox = StanzaInbox(capacity: 2)
        let consumer = Task { await inbox.nextNames(maximum: 10) }
        while !inbox.hasWaitingConsumer { await Task.yield() }
        consumer.cancel()
        #expect(await consumer.value == nil)
        // What arrives later is still there for the next consumer.
        inbox.offerAndHandOver("later")
        #expect(await inbox.nextNames() == ["later"])
    }
}
