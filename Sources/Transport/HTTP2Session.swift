internal import CNGHTTP2
import Foundation

/// One HTTP/2 connection's protocol state over libnghttp2 (the one owner of its
/// `nghttp2_session`, freed in `deinit`), client or server, without I/O: bytes read go in
/// (`receive`), the frames to write come out (`output`), and what completed is reported to
/// its `events` handler. Used by one thread only (its stream loop).
package final class HTTP2Session {
    package enum Role: Sendable { case client, server }

    /// A request or a response: headers (pseudo-headers included, names lower-cased) and body.
    package struct Message: Sendable, Equatable {
        package var headers: [(name: String, value: String)]
        package var body: [UInt8]

        package init(headers: [(name: String, value: String)], body: [UInt8]) {
            self.headers = headers
            self.body = body
        }

        package func header(_ name: String) -> String? { headers.first { $0.name == name }?.value }

        package static func == (a: Message, b: Message) -> Bool {
            a.body == b.body && a.headers.map { [$0.name, $0.value] } == b.headers.map { [$0.name, $0.value] }
        }
    }

    /// What the session tells its owner, on its thread.
    package enum Event {
        /// A complete message on a stream: a response (client) or a request (server).
        case message(streamID: Int32, Message)
        /// A stream closed; `errorCode` 0 when it ended normally (after its message).
        case streamClosed(streamID: Int32, errorCode: UInt32)
        /// The peer will take no new stream: those above `lastStreamID` were not processed.
        case goAway(lastStreamID: Int32, errorCode: UInt32)
        /// Server: a request's body passed `maximumBody`; the rest of it is dropped as it
        /// comes, and the request is for the owner to answer (413). (A client resets a
        /// response that large instead.)
        case bodyTooLarge(streamID: Int32)
        /// Server: a request's header list passed `maximumHeaderListBytes`; its stream was
        /// reset and what it had is dropped.
        case headersTooLarge(streamID: Int32)
    }

    /// HTTP/2's error codes this code names.
    package enum ErrorCode {
        package static let noError: UInt32 = 0
        package static let refusedStream: UInt32 = UInt32(NGHTTP2_REFUSED_STREAM.rawValue)
        package static let cancel: UInt32 = UInt32(NGHTTP2_CANCEL.rawValue)
        package static let internalError: UInt32 = UInt32(NGHTTP2_INTERNAL_ERROR.rawValue)
    }

    private struct IncomingStream {
        var headers: [(name: String, value: String)] = []
        /// The header list's size as SETTINGS_MAX_HEADER_LIST_SIZE counts it.
        var headerBytes = 0

        mutating func appendHeader(_ field: (name: String, value: String), listBytes: Int) {
            headers.append(field)
            headerBytes = listBytes
        }
        var body: [UInt8] = []
        /// When its first frame came.
        var startedAt = ContinuousClock.now
    }

    let role: Role
    private var session: OpaquePointer?
    private var incoming: [Int32: IncomingStream] = [:]
    /// The stream whose header block is being decoded, and its list's size so far.
    private var headerListStream: Int32 = 0
    private var headerListBytes = 0
    /// Bodies being sent, and how far.
    private var outgoing: [Int32: (body: [UInt8], offset: Int)] = [:]
    private let events: (Event) -> Void
    /// The largest message body kept (a larger one resets its stream).
    let maximumBody: Int
    /// The largest header list taken (announced to the peer; a larger one resets its stream).
    let maximumHeaderListBytes: Int

    /// - Parameters:
    ///   - maximumConcurrentStreams: what a server announces (SETTINGS_MAX_CONCURRENT_STREAMS).
    ///   - events: called with what the session learns, during `receive` and `output`.
    ///   - maximumHeaderListBytes: the largest header list taken from the peer, counted as
    ///     RFC 9113 6.5.2 counts it while HPACK decodes it (a few bytes of references can
    ///     stand for megabytes of fields): a stream past it is reset at once.
    package init(role: Role, maximumConcurrentStreams: UInt32 = 100, maximumBody: Int = 16 << 20, maximumHeaderListBytes: Int = 64 << 10,
                 events: @escaping (Event) -> Void) throws(TransportError) {
        self.role = role
        self.events = events
        self.maximumBody = maximumBody
        self.maximumHeaderListBytes = maximumHeaderListBytes
        var callbacks: OpaquePointer?
        guard nghttp2_session_callbacks_new(&callbacks) == 0, let callbacks else { throw .tlsFailed("nghttp2: out of memory") }
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks) { _, frame, user in
            guard let frame, let user else { return 0 }
            HTTP2Session.from(user).beginHeaders(streamID: frame.pointee.hd.stream_id)
            return 0
        }
        nghttp2_session_callbacks_set_on_header_callback(callbacks) { _, frame, name, nameLength, value, valueLength, _, user in
            guard let frame, let name, let value, let user else { return 0 }
            return HTTP2Session.from(user).header(streamID: frame.pointee.hd.stream_id, name: UnsafeBufferPointer(start: name, count: nameLength),
                                                  value: UnsafeBufferPointer(start: value, count: valueLength))
        }
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks) { _, _, streamID, data, length, user in
            guard let data, let user else { return 0 }
            return HTTP2Session.from(user).data(streamID: streamID, UnsafeRawBufferPointer(start: data, count: length))
        }
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks) { _, frame, user in
            guard let frame, let user else { return 0 }
            HTTP2Session.from(user).frameReceived(frame.pointee)
            return 0
        }
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks) { _, streamID, errorCode, user in
            guard let user else { return 0 }
            HTTP2Session.from(user).streamClosed(streamID: streamID, errorCode: errorCode)
            return 0
        }
        var created: OpaquePointer?
        let user = Unmanaged.passUnretained(self).toOpaque()
        let status = role == .client ? nghttp2_session_client_new(&created, callbacks, user)
                                     : nghttp2_session_server_new(&created, callbacks, user)
        guard status == 0, let created else { throw .tlsFailed("nghttp2: cannot make a session") }
        session = created
        var settings = [nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue),
                                               value: maximumConcurrentStreams),
                        nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: 1 << 20),
                        nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue),
                                               value: UInt32(clamping: maximumHeaderListBytes))]
        nghttp2_submit_settings(created, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, settings.count)
        // The connection's window: as large as the streams' together may need.
        nghttp2_session_set_local_window_size(created, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, 16 << 20)
    }

    deinit {
        if let session { nghttp2_session_del(session) }
    }

    private static func from(_ user: UnsafeMutableRawPointer) -> HTTP2Session {
        Unmanaged<HTTP2Session>.fromOpaque(user).takeUnretainedValue()
    }

    // MARK: - I/O

    /// Feeds bytes read from the peer.
    /// - Throws: `TransportError.connectionLost` when they break the protocol (the
    ///   connection must end).
    package func receive(_ bytes: UnsafeRawBufferPointer) throws(TransportError) {
        guard let session, let base = bytes.baseAddress else { return }
        let read = nghttp2_session_mem_recv(session, base.assumingMemoryBound(to: UInt8.self), bytes.count)
        if read < 0 {
            throw .connectionLost("HTTP/2: \(String(cString: nghttp2_strerror(Int32(read))))")
        }
    }

    /// The frames to write now (empty when none).
    package func output() -> [UInt8] {
        guard let session else { return [] }
        var bytes: [UInt8] = []
        while true {
            var data: UnsafePointer<UInt8>?
            let count = nghttp2_session_mem_send(session, &data)
            guard count > 0, let data else { break }
            bytes.append(contentsOf: UnsafeBufferPointer(start: data, count: count))
        }
        return bytes
    }

    /// Whether either side still wants the connection (false once both ended it).
    package var isAlive: Bool {
        guard let session else { return false }
        return nghttp2_session_want_read(session) != 0 || nghttp2_session_want_write(session) != 0
    }

    /// True once the peer's first SETTINGS frame arrived (its limits are known).
    package private(set) var hasPeerSettings = false

    /// The streams the peer lets this side open at once.
    package var peerMaximumConcurrentStreams: Int {
        guard let session else { return 0 }
        return Int(nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS))
    }

    /// When the oldest message still arriving (its first frame here, its last not yet)
    /// began; nil when none is arriving.
    package var oldestArrivalStart: ContinuousClock.Instant? {
        var oldest: ContinuousClock.Instant?
        for stream in incoming.values where oldest == nil || stream.startedAt < oldest! { oldest = stream.startedAt }
        return oldest
    }

    /// Gives up on the messages still arriving that began before `instant` (what more comes
    /// of them is dropped) and returns their streams, for the owner to answer or reset.
    package func abandonArrivals(startedBefore instant: ContinuousClock.Instant) -> [Int32] {
        let late = incoming.filter { $0.value.startedAt < instant }.map(\.key).sorted()
        for streamID in late { incoming[streamID] = nil }
        return late
    }

    // MARK: - Submitting

    /// Opens a stream with `request` (`:method`, `:scheme`, `:authority`, `:path` first).
    /// Returns its id.
    /// - Throws: `TransportError.connectionLost` when no stream can be opened (the session
    ///   is going away, or ids ran out).
    package func submitRequest(_ request: Message) throws(TransportError) -> Int32 {
        guard let session else { throw .connectionLost("HTTP/2 session closed") }
        let streamID = submit(request.headers, hasBody: !request.body.isEmpty) { headers, count, provider in
            nghttp2_submit_request(session, nil, headers, count, provider, nil)
        }
        guard streamID > 0 else { throw .connectionLost("HTTP/2: \(String(cString: nghttp2_strerror(streamID)))") }
        if !request.body.isEmpty { outgoing[streamID] = (request.body, 0) }
        return streamID
    }

    /// Answers the request on `streamID` (`:status` first).
    package func submitResponse(_ response: Message, on streamID: Int32) {
        guard let session else { return }
        if !response.body.isEmpty { outgoing[streamID] = (response.body, 0) }
        let status = submit(response.headers, hasBody: !response.body.isEmpty) { headers, count, provider in
            nghttp2_submit_response(session, streamID, headers, count, provider)
        }
        if status != 0 { outgoing[streamID] = nil }
    }

    /// Resets a stream with `errorCode`.
    package func reset(_ streamID: Int32, errorCode: UInt32) {
        guard let session else { return }
        nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, errorCode)
    }

    /// Tells the peer no stream after `lastStreamID` (by default the last one processed)
    /// will be; with `errorCode` 0, those under way still finish.
    package func goAway(errorCode: UInt32 = ErrorCode.noError, lastStreamID: Int32? = nil) {
        guard let session else { return }
        let last = lastStreamID ?? nghttp2_session_get_last_proc_stream_id(session)
        nghttp2_submit_goaway(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), last, errorCode, nil, 0)
    }

    private func submit(_ headers: [(name: String, value: String)], hasBody: Bool,
                        _ body: (UnsafePointer<nghttp2_nv>, Int, UnsafePointer<nghttp2_data_provider>?) -> Int32) -> Int32 {
        // Every name and value in one buffer (nghttp2 copies them during the call).
        var bytes: [UInt8] = []
        bytes.reserveCapacity(headers.reduce(1) { $0 + $1.name.utf8.count + $1.value.utf8.count })
        var spans: [(name: Range<Int>, value: Range<Int>)] = []
        spans.reserveCapacity(headers.count)
        for (name, value) in headers {
            let nameStart = bytes.count
            bytes += name.utf8
            let valueStart = bytes.count
            bytes += value.utf8
            spans.append((nameStart..<valueStart, valueStart..<bytes.count))
        }
        if bytes.isEmpty { bytes.append(0) }
        return bytes.withUnsafeMutableBufferPointer { buffer in
            let base = buffer.baseAddress!
            var list: [nghttp2_nv] = []
            list.reserveCapacity(headers.count)
            for span in spans {
                list.append(nghttp2_nv(name: base + span.name.lowerBound, value: base + span.value.lowerBound,
                                       namelen: span.name.count, valuelen: span.value.count,
                                       flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue)))
            }
            var provider = nghttp2_data_provider()
            provider.read_callback = { _, streamID, buffer, length, flags, _, user in
                guard let user, let buffer, let flags else { return 0 }
                return HTTP2Session.from(user).readBody(streamID: streamID, into: buffer, length: length, flags: flags)
            }
            return list.withUnsafeBufferPointer { nva in
                withUnsafePointer(to: &provider) { providerPointer in
                    body(nva.baseAddress!, nva.count, hasBody ? providerPointer : nil)
                }
            }
        }
    }

    // MARK: - Callbacks (during `receive` and `output`)

    private func readBody(streamID: Int32, into buffer: UnsafeMutablePointer<UInt8>, length: Int,
                          flags: UnsafeMutablePointer<UInt32>) -> Int {
        guard let (body, offset) = outgoing[streamID] else {
            flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
            return 0
        }
        let count = min(length, body.count - offset)
        body.withUnsafeBufferPointer { source in
            buffer.update(from: source.baseAddress! + offset, count: count)
        }
        if offset + count >= body.count {
            flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
            outgoing[streamID] = nil
        } else {
            outgoing[streamID] = (body, offset + count)
        }
        return count
    }

    private func beginHeaders(streamID: Int32) {
        if incoming[streamID] == nil { incoming[streamID] = IncomingStream() }
        headerListStream = streamID
        headerListBytes = incoming[streamID]?.headerBytes ?? 0
    }

    /// Keeps a field, or (the list over its limit) resets the stream: nghttp2 then decodes
    /// the rest of the block for HPACK's sake without handing it over.
    private func header(streamID: Int32, name: UnsafeBufferPointer<UInt8>, value: UnsafeBufferPointer<UInt8>) -> Int32 {
        // A block's fields come one after another for one stream: its size is counted here,
        // not looked up in `incoming` for every field.
        if headerListStream != streamID {
            headerListStream = streamID
            headerListBytes = incoming[streamID]?.headerBytes ?? 0
        }
        headerListBytes += name.count + value.count + 32
        guard headerListBytes <= maximumHeaderListBytes else {
            incoming[streamID] = nil
            headerListStream = 0
            if role == .server {
                events(.headersTooLarge(streamID: streamID))
            }
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue
        }
        let field = (String(decoding: name, as: UTF8.self), String(decoding: value, as: UTF8.self))
        let size = headerListBytes
        incoming[streamID, default: IncomingStream()].appendHeader(field, listBytes: size)
        return 0
    }

    private func data(streamID: Int32, _ bytes: UnsafeRawBufferPointer) -> Int32 {
        guard let count = incoming[streamID]?.body.count else { return 0 }
        guard count + bytes.count <= maximumBody else {
            incoming[streamID] = nil
            if role == .server {
                events(.bodyTooLarge(streamID: streamID))
            } else {
                reset(streamID, errorCode: ErrorCode.internalError)
            }
            return 0
        }
        // In place: a copy of the stream taken out and put back would copy its body too.
        incoming[streamID]?.body.append(contentsOf: bytes)
        return 0
    }

    private func frameReceived(_ frame: nghttp2_frame) {
        let type = Int32(frame.hd.type)
        if type == Int32(NGHTTP2_SETTINGS.rawValue), frame.hd.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) == 0 {
            hasPeerSettings = true
            return
        }
        if type == Int32(NGHTTP2_GOAWAY.rawValue) {
            events(.goAway(lastStreamID: frame.goaway.last_stream_id, errorCode: frame.goaway.error_code))
            return
        }
        guard type == Int32(NGHTTP2_HEADERS.rawValue) || type == Int32(NGHTTP2_DATA.rawValue),
              frame.hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0 else { return }
        let streamID = frame.hd.stream_id
        guard let stream = incoming[streamID] else { return }
        // A 1xx response's headers are not the answer.
        if role == .client, let status = stream.headers.first(where: { $0.name == ":status" })?.value, status.hasPrefix("1") { return }
        incoming[streamID] = nil
        events(.message(streamID: streamID, Message(headers: stream.headers, body: stream.body)))
    }

    private func streamClosed(streamID: Int32, errorCode: UInt32) {
        incoming[streamID] = nil
        outgoing[streamID] = nil
        events(.streamClosed(streamID: streamID, errorCode: errorCode))
    }
}
