/// A value that arrives once, from any thread, and that any number of tasks can await.
package final class OneShot<Value: Sendable>: Sendable {
    private struct State {
        var result: Result<Value, any Error>?
        var waiters = Waiters<Result<Value, any Error>>()
    }
    private let state = BlockingLock(State())

    package init() {}

    /// Sets the result; later calls are ignored. Returns whether this call set it.
    @discardableResult
    package func complete(_ result: Result<Value, any Error>) -> Bool {
        let waiters = state.withLock { state -> [CheckedContinuation<Result<Value, any Error>, Never>]? in
            guard state.result == nil else { return nil }
            state.result = result
            return state.waiters.removeAll()
        }
        guard let waiters else { return false }
        for waiter in waiters { waiter.resume(returning: result) }
        return true
    }

    /// True once a result is set.
    package var isCompleted: Bool { state.withLock { $0.result != nil } }

    /// The result, waiting for it if needed.
    /// - Throws: the failure it was completed with, or `CancellationError` when the task
    ///   is cancelled before it arrives.
    package func value() async throws -> Value {
        try await state.suspend(in: \.waiters, cancelled: .failure(CancellationError())) { $0.result }.get()
    }
}
