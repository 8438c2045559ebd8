import Foundation
import Runtime

/// What a server does with a request.
package enum HTTPServerAction: Sendable {
    /// What the connection does after a response.
    package enum Afterwards: Sendable {
        case keepOpen
        /// HTTP/2: a `GOAWAY` at once, naming this request's stream as the last processed
        /// one (a later stream is refused, unprocessed), and the connection closes once the
        /// streams under way are answered. HTTP/1.1: `Connection: close` on the answer.
        case goAway
    }

    /// Answers, after `delay`.
    case respond(HTTPServerResponse, after: Duration = .zero, then: Afterwards = .keepOpen)
    /// HTTP/2: resets the request's stream (`INTERNAL_ERROR`), after it was processed.
    /// HTTP/1.1: closes the connection without an answer.
    case resetStream
    /// Closes the connection at once, without an answer.
    case dropConnection
    /// Never answers.
    case hold
    /// Answers later, through the request's `reply`.
    case later
}
