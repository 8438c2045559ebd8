import Foundation
import Runtime

/// The way back to one request for an answer given later (`HTTPServerAction.later`): safe
/// from any thread, used once. An answer to a request whose connection or stream ended is
/// dropped (the client saw no answer, and retries).
package struct HTTPServerReply: Sendable {
    let mailbox: HTTPReplyMailbox
    let streamID: Int32

    /// Sends `response` as the request's answer.
    package func send(_ response: HTTPServerResponse) {
        mailbox.post(response, on: streamID)
    }
}
