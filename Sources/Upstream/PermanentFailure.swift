/// Thrown by a handler for a message that can never be handled (invalid for the
/// application, not a passing fault): the message is dead-lettered at once, without the
/// retries a passing failure gets. The dead letter keeps the description (`error`), the
/// code (`code`) and the handler that threw it (`handler`).
public struct PermanentFailure: Error, CustomStringConvertible {
    public let description: String
    /// A short reason that stays the same from one message to the next (`missing_room`,
    /// `text_too_long`), for queries, alerts and `dead-letters list`; nil when not given.
    public let code: String?

    public init(_ description: String, code: String? = nil) {
        self.description = description
        self.code = code
    }
}
