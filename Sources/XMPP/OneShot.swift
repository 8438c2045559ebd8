import Synchronization

/// A value that arrives once, from any thread, and that any number of tasks can await.
final class OneShot<Value: Sendable>: Sendable {
    private struct State {
        var result: Result<Value, any Error>?
        var waiters: [CheckedContinuation<Value, any Error>] = []
    }
    private let state = Mutex(State())

    /// Sets the result; later calls are ignored. Returns whether this call set it.
    @discardableResult
    func complete(_ result: Result<Value, any Error>) -> Bool {
        let waiters = state.withLock { state -> [CheckedContinuation<Value, any Error>]? in
            guard state.result == nil else { return nil }
            state.result = result
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        guard let waiters else { return false }
        for waiter in waiters { waiter.resume(with: result) }
        return true
    }

    /// True once a result is set.
    var isCompleted: Bool { state.withLock { $0.result != nil } }

    /// The result, waiting for it if needed.
    func value() async throws -> Value {
        try await withCheckedThrowingContinuation { continuation in
            let result = state.withLock { state -> Result<Value, any Error>? in
                if let result = state.result { return result }
                state.waiters.append(continuation)
                return nil
            }
            if let result { continuation.resume(with: result) }
        }
    }
}
