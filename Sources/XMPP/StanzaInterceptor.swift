/// Logic that runs on a connection's own thread for each stanza received on the
/// established stream, before the stanza is queued for `next()`.
///
/// FCM's acks are sent from here: they leave as soon as the stanza is parsed, whatever the
/// consuming tasks are doing, and keep flowing when the consumer applies backpressure.
/// Keep it fast and non-blocking: it runs on the I/O thread.
public protocol StanzaInterceptor: Sendable {
    func intercept(_ stanza: XMLElement) -> Interception
}

/// What an interceptor wants done with one stanza.
public struct Interception: Sendable {
    /// Text to write at once (one or more complete stanzas), only if the stanza is queued
    /// for the consumer; nil for none.
    public var reply: String?
    /// A value handed to the consumer with the stanza (for instance what was parsed).
    public var attachment: (any Sendable)?

    public init(reply: String? = nil, attachment: (any Sendable)? = nil) {
        self.reply = reply
        self.attachment = attachment
    }
}

/// A received stanza and what its interceptor attached to it.
public struct ReceivedStanza: Sendable {
    public let element: XMLElement
    public let attachment: (any Sendable)?

    public init(element: XMLElement, attachment: (any Sendable)? = nil) {
        self.element = element
        self.attachment = attachment
    }
}
