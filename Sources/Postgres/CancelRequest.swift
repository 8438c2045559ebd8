internal import CLibPQ

/// A `PGcancel`, sent from a thread of its own and then freed. `@unchecked Sendable`: libpq
/// makes a `PGcancel` to be used from another thread; only that thread uses it.
final class CancelRequest: @unchecked Sendable {
    private let cancel: OpaquePointer

    init(_ cancel: OpaquePointer) { self.cancel = cancel }

    func send() {
        var buffer = [CChar](repeating: 0, count: 256)
        _ = PQcancel(cancel, &buffer, Int32(buffer.count))
        PQfreeCancel(cancel)
    }
}
