/// Logic that runs on a connection's own thread for each stanza received on the
/// established stream, before what it makes of the stanza is queued for the consumer.
///
/// FCM's acks are sent from here: they leave as soon as the stanza is parsed, whatever the
/// consuming tasks are doing, and keep flowing when the consumer applies backpressure.
/// Keep it fast and non-blocking: it runs on the I/O thread.
public protocol StanzaInterceptor<Inbound>: Sendable {
    /// What the consumer gets for each stanza.
    associatedtype Inbound: Sendable
    func intercept(_ stanza: XMLElement) -> Interception<Inbound>
    /// A stanza too large to keep, read to its end (`XMPPClientConfiguration.maxStanzaBytes`):
    /// what it can be answered with and handed on as. The default hands nothing on (it is
    /// dropped).
    func interceptOversized(_ stanza: OversizedStanza) -> Interception<Inbound>
    /// Called on the connection's thread after the stanzas of one read have been
    /// intercepted: work the interceptor queued for them can start here, once per read
    /// rather than once per stanza (journal mode wakes its journal's writer here, so that
    /// one flush takes the whole read). Keep it fast and non-blocking, like `intercept`.
    func didInterceptRead()
    /// `inbound` as the one object the connection's inbox holds for it, made on the
    /// connection's thread. The default wraps it in an `InboundBox`; an interceptor whose
    /// common `Inbound` already holds an object can hand that object on instead (one
    /// allocation less per stanza), as long as `unbox` tells the two apart. Implement both
    /// or neither: the default `unbox` opens boxes without checking.
    func box(_ inbound: Inbound) -> any AnyObject & Sendable
    /// What `box` made of an `Inbound`, opened again (on the consuming task).
    static func unbox(_ item: any AnyObject & Sendable) -> Inbound
    /// `intercept`, with its `inbound` boxed: what the connection's thread calls for each
    /// stanza. Leave it to its default, which is inlinable and so compiled for each
    /// interceptor where that conforms: the thread then runs no generic code per stanza
    /// (generic code looked up the interception's types at run time, a few percent of the
    /// thread's CPU).
    func interceptBoxed(_ stanza: XMLElement) -> BoxedInterception
    /// `interceptOversized`, with its `inbound` boxed; leave it to its default too.
    func interceptOversizedBoxed(_ stanza: OversizedStanza) -> BoxedInterception
}

extension StanzaInterceptor {
    public func didInterceptRead() {}
    public func interceptOversized(_ stanza: OversizedStanza) -> Interception<Inbound> { Interception(inbound: nil) }
    public func box(_ inbound: Inbound) -> any AnyObject & Sendable { InboundBox(inbound) }
    /// Opens an `InboundBox` without a checked cast: only the interceptor's own `box` fills
    /// its connection's inbox, with boxes of its one `Inbound` type.
    public static func unbox(_ item: any AnyObject & Sendable) -> Inbound { InboundBox<Inbound>.open(item) }
    @inlinable
    public func interceptBoxed(_ stanza: XMLElement) -> BoxedInterception {
        boxed(intercept(stanza))
    }
    @inlinable
    public func interceptOversizedBoxed(_ stanza: OversizedStanza) -> BoxedInterception {
        boxed(interceptOversized(stanza))
    }
    /// `interception` with its `inbound` boxed.
    @inlinable
    func boxed(_ interception: Interception<Inbound>) -> BoxedInterception {
        var item: (any AnyObject & Sendable)?
        if let inbound = interception.inbound { item = box(inbound) }
        return BoxedInterception(reply: interception.reply, item: item, closesSendGate: interception.closesSendGate)
    }
}

/// An `Interception` with its `inbound` boxed (`StanzaInterceptor.box`), as the
/// connection's inbox takes it.
public struct BoxedInterception: Sendable {
    public var reply: String?
    public var item: (any AnyObject & Sendable)?
    public var closesSendGate: Bool

    @inlinable
    public init(reply: String?, item: (any AnyObject & Sendable)?, closesSendGate: Bool) {
        self.reply = reply
        self.item = item
        self.closesSendGate = closesSendGate
    }
}

/// What an interceptor makes of one stanza.
public struct Interception<Inbound: Sendable>: Sendable {
    /// Text to write at once (one or more complete stanzas), only if `inbound` is queued
    /// for the consumer (or there is none); nil for none.
    public var reply: String?
    /// What the consumer gets; nil when the interceptor dealt with the stanza itself.
    public var inbound: Inbound?
    /// Closes the connection's send gate before anything read after this stanza is
    /// handled: `XMPPConnection.sendUnlessGateClosed` refuses from then on, and what it had
    /// queued goes out ahead of any later reply.
    public var closesSendGate: Bool

    public init(reply: String? = nil, inbound: Inbound?, closesSendGate: Bool = false) {
        self.reply = reply
        self.inbound = inbound
        self.closesSendGate = closesSendGate
    }
}

/// Hands every stanza to the consumer as it is, and writes nothing.
public struct PassThrough: StanzaInterceptor {
    public init() {}
    public func intercept(_ stanza: XMLElement) -> Interception<XMLElement> { Interception(inbound: stanza) }
}
