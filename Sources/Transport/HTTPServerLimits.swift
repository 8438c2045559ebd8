import Foundation
import Runtime

/// What a server connection accepts and how long it waits: a client over these limits is
/// answered (413, 431, 408), reset or disconnected, never waited for without end, and a
/// connection's memory stays bounded whatever its peer sends or fails to read.
package struct HTTPServerLimits: Sendable {
    /// The largest request body.
    package var maximumBodyBytes: Int
    /// The largest request head, counted as it arrives: HTTP/1.1's start line and fields (431
    /// past it), HTTP/2's decoded header list, each field counted as RFC 9113's
    /// `SETTINGS_MAX_HEADER_LIST_SIZE` (announced) counts it: name, value and 32 (the stream
    /// is reset past it).
    package var maximumHeadBytes: Int
    /// Announced in HTTP/2's `SETTINGS_MAX_CONCURRENT_STREAMS`.
    package var maximumConcurrentStreams: UInt32
    /// A connection with no request under way and none arriving for this long is closed
    /// (HTTP/2 PINGs and SETTINGS do not count as requests).
    package var idleTimeout: Duration?
    /// A request begun must be complete within this (a client sending its bytes slowly to
    /// hold the connection gets 408: HTTP/1.1 closes, HTTP/2 answers the stream).
    package var requestTimeout: Duration?
    /// A TLS handshake not done within this closes the connection.
    package var handshakeTimeout: Duration
    /// While more than this many answer bytes wait for a peer that does not read, the
    /// connection reads nothing more from it (backpressure: pipelined requests and PINGs stay
    /// in the socket's buffers, not in this process).
    package var maximumPendingOutputBytes: Int

    package init(maximumBodyBytes: Int = 8 << 20, maximumHeadBytes: Int = 16 << 10, maximumConcurrentStreams: UInt32 = 100,
                 idleTimeout: Duration? = nil, requestTimeout: Duration? = nil, handshakeTimeout: Duration = .seconds(10),
                 maximumPendingOutputBytes: Int = 256 << 10) {
        self.maximumBodyBytes = maximumBodyBytes
        self.maximumHeadBytes = maximumHeadBytes
        self.maximumConcurrentStreams = maximumConcurrentStreams
        self.idleTimeout = idleTimeout
        self.requestTimeout = requestTimeout
        self.handshakeTimeout = handshakeTimeout
        self.maximumPendingOutputBytes = maximumPendingOutputBytes
    }
}
