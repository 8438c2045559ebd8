import Foundation
import Runtime

/// Answers given later, from other threads, for one connection's loop to send.
package final class HTTPReplyMailbox: Sendable {
    private struct State {
        var loop: StreamLoop?
        var replies: [(streamID: Int32, response: HTTPServerResponse)] = []
        var goAway = false
    }

    private let state = BlockingLock(State())

    func attach(_ loop: StreamLoop) { state.withLock { $0.loop = loop } }

    /// The loop ended: what is posted from now on is dropped (and the loop released).
    func detach() { state.withLock { $0 = State() } }

    func post(_ response: HTTPServerResponse, on streamID: Int32) {
        let loop = state.withLock { state -> StreamLoop? in
            guard let loop = state.loop else { return nil }
            state.replies.append((streamID, response))
            return loop
        }
        loop?.wake()
    }

    /// Closes the connection at once, answering nothing more (`HTTPServer` making room).
    package func abort() {
        state.withLock { $0.loop }?.requestClose(.abort(TransportError.connectionLost("dropped for a newer connection")))
    }

    /// Asks the connection to finish what is under way and close (`HTTPServer.drain`).
    package func requestGoAway() {
        state.withLock { state -> StreamLoop? in
            state.goAway = true
            return state.loop
        }?.wake()
    }

    func take() -> (replies: [(streamID: Int32, response: HTTPServerResponse)], goAway: Bool) {
        state.withLock { state in
            defer { state.replies.removeAll() }
            return (state.replies, state.goAway)
        }
    }
}
