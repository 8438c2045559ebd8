import Postgres
import Runtime

/// Runs the registered handlers on a batch's messages inside its transaction: each route
/// gets the messages it matches, in arrival order, as one batch when it is a batch handler.
struct UpstreamDispatcher: Sendable {
    let handlers: UpstreamHandlers
    let logger: Logger

    /// Runs every matching handler's `check` on each message of `batch`: the messages a
    /// handler refused come back as dead letters in their place (with the refusal).
    func check(_ batch: [UpstreamWork]) -> [UpstreamWork] {
        batch.map { work in
            guard case .message(let message) = work.kind else { return work }
            for route in handlers.routes where route.match.matches(message) {
                do {
                    try route.handler.check(message)
                } catch {
                    logger.warning("message \(message.messageID) refused by handler \(route.name), dead-lettered: \(error)")
                    var letter = work
                    letter.attempts = 1
                    letter.kind = .deadLetter(.init(messageID: message.messageID, from: message.from, category: message.category,
                                                    rawPayload: message.rawPayload, reason: "handler_failed",
                                                    error: "\(route.name): \(error)", attempts: 1, receivedAt: message.receivedAt))
                    return letter
                }
            }
            return work
        }
    }

    /// Runs every matching handler on `messages`. With `batchingSingles`, a batch handler
    /// gets even a single message as a batch (a recording handler's batch statement is the
    /// one that fails on a message handled before).
    func handle(_ messages: [UpstreamMessage], in transaction: UpstreamTransaction, batchingSingles: Bool) async throws {
        for route in handlers.routes {
            let matching = messages.filter { route.match.matches($0) }
            guard !matching.isEmpty else { continue }
            let handlerLogger = logger.labeled("handler \(route.name)")
            if let batchHandler = route.handler as? any BatchUpstreamHandler, matching.count > 1 || batchingSingles {
                try await batchHandler.handle(batch: matching, in: BatchContext(logger: handlerLogger, transaction: transaction))
            } else {
                for message in matching {
                    try await route.handler.handle(message, in: HandlerContext(message: message, logger: handlerLogger, transaction: transaction))
                }
            }
        }
    }
}
