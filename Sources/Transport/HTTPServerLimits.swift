import Foundation
import Runtime

/// What a server connection accepts and how long it waits: a client over these limits is
/// answered (413, 408) or disconnected, never waited for without end.
package struct HTTPServerLimits: Sendable {
    /// The largest request body.
    package var maximumBodyBytes: Int
    /// Announced in HTTP/2's `SETTINGS_MAX_CONCURRENT_STREAMS`.
    package var maximumConcurrentStreams: UInt32
    /// A connection with no request under way and nothing read for this long is closed.
    package var idleTimeout: Duration?
    /// HTTP/1.1: a request begun must be complete within this (a client sending its bytes
    /// slowly to hold the connection gets 408 and a close).
    package var requestTimeout: Duration?

    package init(maximumBodyBytes: Int = 8 << 20, maximumConcurrentStreams: UInt32 = 100, idleTimeout: Duration? = nil,
                 requestTimeout: Duration? = nil) {
        self.maximumBodyBytes = maximumBodyBytes
        self.maximumConcurrentStreams = maximumConcurrentStreams
        self.idleTimeout = idleTimeout
        self.requestTimeout = requestTimeout
    }
}
