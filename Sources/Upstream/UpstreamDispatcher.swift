import FCM
import Postgres
import Runtime

/// Runs the registered handlers on a batch's messages inside its transaction: each route
/// gets the messages it matches, in arrival order, as one batch when it is a batch handler.
package struct UpstreamDispatcher: Sendable {
    let handlers: UpstreamHandlers
    let logger: Logger
    let metrics: any UpstreamMetrics
    /// What the handlers' timeouts are timed by (a test may move it by hand).
    var clock: any DeadlineClock = DeadlineThread.shared
    /// One warning per category and minute for messages no route matches.
    let unroutedWarnings = WarningThrottle()

    /// A handler refused one message for good (`PermanentFailure`, or a reply FCM would
    /// refuse) during a batch: the batch rolls back and commits again without handling it.
    struct Refusal: Error, CustomStringConvertible {
        let messageID: String
        let route: String
        let error: any Error

        var description: String { "\(route): \(error)" }
    }

    /// A handler's call threw: what it threw, and which handler. (The database going away
    /// under a handler is not its failure: that error goes up as it is, and the batch waits
    /// for the database.)
    struct HandlerFailure: Error, CustomStringConvertible {
        let route: String
        let error: any Error

        var description: String { "\(error)" }
    }

    /// A handler ran past its `timeout`.
    struct Timeout: Error, CustomStringConvertible {
        let route: String
        let limit: Duration

        var description: String { "handler \(route) ran longer than its timeout of \(limit.formattedSeconds) and was cancelled" }
    }

    /// True for an error retrying cannot fix.
    static func isPermanent(_ error: any Error) -> Bool {
        if let failure = error as? HandlerFailure { return isPermanent(failure.error) }
        return error is PermanentFailure || error is DownstreamValidationError || error is Refusal
    }

    /// The handler an error came from, and its reason code, for the dead letter it makes.
    static func blame(_ error: any Error) -> (handler: String?, code: String?) {
        switch error {
        case let failure as HandlerFailure: (failure.route, code(of: failure.error))
        case let refusal as Refusal: (refusal.route, code(of: refusal.error))
        default: (nil, code(of: error))
        }
    }

    /// A refusal's reason code: a `PermanentFailure`'s own, `invalid_downstream` for a reply
    /// FCM would refuse, `timeout` for a call cancelled at its limit.
    static func code(of error: any Error) -> String? {
        switch error {
        case let failure as PermanentFailure: failure.code
        case is DownstreamValidationError: "invalid_downstream"
        case is Timeout: "timeout"
        default: nil
        }
    }

    /// Runs every matching handler's `check` on each message of `batch`: the messages a
    /// handler refused come back as dead letters in their place (with the refusal), and so
    /// do the messages no route matches (`unrouted`: kept, never marked handled, replayable
    /// once the routes are fixed). Before that, a message whose `message_id`, `from` or
    /// `category` cannot be stored as it is is dead-lettered as unreadable, once: one holding
    /// U+0000 (JSON allows `\u0000`; PostgreSQL's text holds none, and libpq would cut the
    /// text there, making another message's id of it), or an id or token too long for an
    /// index entry (a 15 KB `message_id` failed every attempt, then its dead letter failed
    /// too, every second, forever). Its id is kept as its digest.
    ///
    /// The batch comes back as it went in, not copied, unless a message became a dead letter.
    func check(_ batch: [UpstreamWork]) -> [UpstreamWork] {
        // Each message is looked at where it lies, through the batch's buffer: read through
        // the array, every piece of work was copied whole to look at it (its reference
        // counts up and down, through its type's value witnesses), a few percent of the
        // handling tasks' CPU. The batch is copied only when a message became a dead letter.
        let refusals = batch.withUnsafeBufferPointer { works in
            works.indices.compactMap { index -> (Int, UpstreamMessage, CheckRefusal)? in
                guard case .message(let message) = works[index].kind, let refusal = refusal(of: message) else { return nil }
                return (index, message, refusal)
            }
        }
        guard !refusals.isEmpty else { return batch }
        var checked = batch
        for (index, message, refusal) in refusals { checked[index] = letter(for: batch[index], message, refusal) }
        return checked
    }

    /// Why `message` may not reach the handlers: a field PostgreSQL cannot store, a
    /// handler's `check`, or no route.
    private enum CheckRefusal {
        case unstorable(String)
        case refused(route: String, error: any Error)
        case unrouted
    }

    /// Why `message` may not reach the handlers; nil when it may. A handler's refusal is
    /// logged here, the others when `letter(for:_:_:)` makes their dead letter.
    private func refusal(of message: UpstreamMessage) -> CheckRefusal? {
        if let problem = Self.unstorableField(message) { return .unstorable(problem) }
        var routed = false
        for route in handlers.routes where route.match.matches(message) {
            routed = true
            do {
                try route.handler.check(message)
            } catch {
                logger.warning("message \(message.messageID) refused by handler \(route.name), dead-lettered: \(error)",
                               metadata: ["message_id": message.messageID, "handler": route.name])
                return .refused(route: route.name, error: error)
            }
        }
        return routed ? nil : .unrouted
    }

    /// `work` as the dead letter `refusal` makes of it.
    private func letter(for work: UpstreamWork, _ message: UpstreamMessage, _ refusal: CheckRefusal) -> UpstreamWork {
        switch refusal {
        case .unstorable(let problem):
            let shown = Self.shown(message.messageID)
            logger.warning("message \(shown) dead-lettered: \(problem)", metadata: ["message_id": shown])
            return Self.unreadable(work, message, error: "\(problem) (message_id \(shown))")
        case .refused(let route, let error):
            return Self.deadLetter(work, message, error: "\(route): \(error)", handler: route, code: Self.code(of: error))
        case .unrouted:
            return unrouted(work, message)
        }
    }

    /// `work` as the dead letter of a message no route matches, with a warning (one per
    /// category and minute, with the number left out since).
    private func unrouted(_ work: UpstreamWork, _ message: UpstreamMessage) -> UpstreamWork {
        let category = message.category.map { "category \"\($0)\"" } ?? "no category"
        let routes = handlers.routes.map { "\($0.name): \($0.match.summary)" }.joined(separator: "; ")
        let error = "no handler's route matches it (\(category); routes: \(routes.isEmpty ? "none" : routes))"
        if let leftOut = unroutedWarnings.admit(message.category ?? "") {
            let since = leftOut > 0 ? " (\(leftOut) more of this category since the last warning)" : ""
            logger.warning("message \(message.messageID) dead-lettered as unrouted: \(error)\(since); "
                           + "fix the routes, then replay it with dead-letters replay",
                           metadata: ["message_id": message.messageID, "category": message.category ?? ""])
        }
        var letter = Self.deadLetter(work, message, error: error)
        if case .deadLetter(var dead) = letter.kind {
            dead.reason = "unrouted"
            letter.kind = .deadLetter(dead)
        }
        return letter
    }

    /// What about `message_id`, `from` or `category` PostgreSQL cannot store as it is, if
    /// anything: U+0000 in any, or an id or token longer than an index entry may be.
    static func unstorableField(_ message: UpstreamMessage) -> String? {
        let limit = UpstreamWork.longestIndexedField
        func problem(_ field: String, _ value: String) -> String? {
            if value.holdsNUL { return "its \(field) holds U+0000, which PostgreSQL text cannot hold" }
            if value.utf8.count > limit {
                return "its \(field) is \(value.utf8.count) bytes long, over the \(limit) an index entry is given"
            }
            return nil
        }
        if let problem = problem("message_id", message.messageID) ?? problem("from", message.from) { return problem }
        if let category = message.category, category.holdsNUL {
            return "its category holds U+0000, which PostgreSQL text cannot hold"
        }
        return nil
    }

    /// An id as the log shows it: U+0000 written out, at most 200 characters.
    static func shown(_ id: String) -> String {
        let text = id.replacingOccurrences(of: "\u{0}", with: "\\u0000")
        return text.count > 200 ? text.prefix(200) + "… (\(id.utf8.count) bytes)" : text
    }

    /// `work` as the dead letter of a message whose fields PostgreSQL cannot hold: its raw
    /// payload (JSON text, where U+0000 is the six characters `\u0000`) is kept, under the
    /// digest of its id (`UpstreamWork.storableMessageID`): the de-duplication record holds
    /// that, so a redelivery is acked and not kept twice, and no cut id becomes another
    /// message's.
    static func unreadable(_ work: UpstreamWork, _ message: UpstreamMessage, error: String) -> UpstreamWork {
        var letter = work
        letter.attempts = 1
        func storable(_ text: String?) -> String? {
            text.flatMap { UpstreamWork.storableText($0) }
        }
        letter.kind = .deadLetter(.init(messageID: UpstreamWork.storableMessageID(message.messageID), from: storable(message.from),
                                        category: storable(message.category), rawPayload: message.rawPayload, reason: "unreadable",
                                        error: error, attempts: 1, receivedAt: message.receivedAt))
        return letter
    }

    /// `work` as the dead letter of a message a handler refused.
    static func deadLetter(_ work: UpstreamWork, _ message: UpstreamMessage, error: String, handler: String? = nil,
                           code: String? = nil) -> UpstreamWork {
        var letter = work
        letter.attempts = 1
        letter.kind = .deadLetter(.init(messageID: message.messageID, from: message.from, category: message.category,
                                        rawPayload: message.rawPayload, reason: "handler_failed", error: error,
                                        attempts: 1, receivedAt: message.receivedAt, handler: handler, code: code))
        return letter
    }

    /// Runs every matching handler on `messages`. With `batchingSingles`, a batch handler
    /// gets even a single message as a batch (a recording handler's batch statement is the
    /// one that fails on a message handled before).
    /// - Throws: `Refusal` when a handler refused one message for good (a per-message call
    ///   threw `PermanentFailure` or `DownstreamValidationError`), otherwise what a handler threw.
    func handle(_ messages: [UpstreamMessage], in transaction: UpstreamTransaction, batchingSingles: Bool) async throws {
        for route in handlers.routes {
            let matching = messages.filter { route.match.matches($0) }
            guard !matching.isEmpty else { continue }
            let handlerLogger = logger.labeled("handler \(route.name)").with(["handler": route.name])
            do {
                if let batchHandler = route.handler as? any BatchUpstreamHandler, matching.count > 1 || batchingSingles {
                    let context = BatchContext(logger: handlerLogger, transaction: transaction)
                    try await call(route) { try await batchHandler.handle(batch: matching, in: context) }
                } else {
                    for message in matching {
                        let context = HandlerContext(message: message, logger: handlerLogger.with(["message_id": message.messageID]),
                                                     transaction: transaction)
                        do {
                            try await call(route) { try await route.handler.handle(message, in: context) }
                        } catch where error is PermanentFailure || error is DownstreamValidationError {
                            throw Refusal(messageID: message.messageID, route: route.name, error: error)
                        }
                    }
                }
            } catch let error as PostgresError where error.isDatabaseState {
                metrics.handler(route.name, runs: matching.count, failed: true)
                throw error
            } catch let error as Refusal {
                metrics.handler(route.name, runs: matching.count, failed: true)
                throw error
            } catch {
                metrics.handler(route.name, runs: matching.count, failed: true)
                throw HandlerFailure(route: route.name, error: error)
            }
            metrics.handler(route.name, runs: matching.count, failed: false)
        }
    }

    /// Runs `body`, cancelled after the route's timeout. The caller waits for `body` to
    /// return either way (it shares the caller's transaction).
    ///
    /// `body` runs as the one child of a task group, so the caller's cancellation reaches it
    /// as any child's does. Whichever comes first, its end or its deadline on the clock,
    /// completes a `OneShot` the caller waits on; at the deadline the caller cancels the
    /// child itself, so that the handler's cancellation handlers run on the caller's task,
    /// never on the deadline thread. (A second child sleeping for the limit did the same
    /// and cost the worker about 3 % of its CPU per upstream message with the store handler
    /// under a timeout; the deadline here is an entry on the clock, not a task.)
    private func call(_ route: UpstreamHandlers.Route, _ body: () async throws -> Void) async throws {
        guard let limit = route.timeout else { return try await body() }
        try await withoutActuallyEscaping(body) { body in
            let work = UncheckedSendable(body)
            try await withThrowingTaskGroup(of: Void.self) { group in
                // True: the handler ended first; false: its deadline passed first.
                let endedInTime = OneShot<Bool>()
                group.addTask {
                    defer { endedInTime.complete(.success(true)) }
                    try await work.value()
                }
                let deadline = clock.schedule(at: clock.now + limit) { endedInTime.complete(.success(false)) }
                // Cancelled while waiting: the child is cancelled with this task, and is
                // awaited below all the same.
                let inTime = (try? await endedInTime.value()) ?? true
                if inTime {
                    clock.cancel(deadline)
                } else {
                    group.cancelAll()
                }
                // The handler's outcome (once cancelled it has given up: it holds the transaction).
                var failure: (any Error)?
                do { try await group.next() } catch { failure = error }
                guard inTime else { throw Timeout(route: route.name, limit: limit) }
                if let failure { throw failure }
            }
        }
    }
}

/// A value handed to a child task that the parent waits for, so that it is never used by
/// two tasks at once (the dispatcher's handler call and its transaction): that hand-off, not
/// the type, is what makes it safe, hence `@unchecked`.
private struct UncheckedSendable<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}
