import Runtime

/// What a stream's thread made of its stanzas, on their way to one consuming task: a
/// `BoundedQueue` the thread `offer`s to (it never waits; a full inbox makes it stop reading
/// the socket until `onRoom`), handing a read's stanzas over together (`handOver()`).
///
/// The items are type-erased, as class references (what the interceptor's `box` makes,
/// an `InboundBox` by default, which its `unbox` opens again): the stream's thread and the
/// queue then run code compiled for one type, instead of generic code that looks its types
/// up at run time for every stanza.
typealias StanzaInbox = BoundedQueue<any AnyObject & Sendable>

extension BoundedQueue where Element == any AnyObject & Sendable {
    /// An inbox's item.
    typealias Item = any AnyObject & Sendable
}

/// An interceptor's result for one stanza, as the inbox holds it (`StanzaInterceptor.box`'s
/// default): one allocation, as the existential it replaces was for any payload larger than
/// three words, and opened with `unsafeDowncast` rather than a checked cast (only one
/// connection's driver, with one `Inbound` type, fills an inbox).
public final class InboundBox<Inbound: Sendable>: Sendable {
    public let value: Inbound
    public init(_ value: Inbound) { self.value = value }

    /// The value of `item`, which must be an `InboundBox<Inbound>` (unchecked).
    public static func open(_ item: any AnyObject & Sendable) -> Inbound {
        unsafeDowncast(item, to: InboundBox<Inbound>.self).value
    }
}
