/// Thrown by a handler for a message that can never be handled (invalid for the
/// application, not a passing fault): the message is dead-lettered at once, without the
/// retries a passing failure gets.
public struct PermanentFailure: Error, CustomStringConvertible {
    public let description: String

    public init(_ description: String) {
        self.description = description
    }
}
