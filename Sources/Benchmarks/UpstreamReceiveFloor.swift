import FCM
import Foundation
import Postgres
import Transport
import XMPP

/// The least CPU the worker's receive path can cost per upstream message with its own
/// parsers: the TLS records a CCS server sent, decrypted by the worker's TLS layer, parsed
/// by its XML stream parser, decoded and acked by its CCS interceptor (immediate mode: the
/// JSON read, the ack stanza made), the acks of each read encrypted in one write, and each
/// message's row encoded as the `store` handler's COPY sends it. All on the calling thread:
/// no socket, poll, queue, task, thread hand-off or database. What the worker spends per
/// message beyond this is the cost of moving the work around (the upstream benchmark's
/// floor phase prints the ratio).
package enum UpstreamReceiveFloor {
    /// TLS records a server wrote, waiting to be replayed once into the client end they
    /// were encrypted for (its keys and record numbers move on as they are read).
    package final class Recording {
        fileprivate let client: TLSMemoryStream
        /// What each socket read would have returned: the records of one window of stanzas.
        fileprivate let reads: [[UInt8]]
        /// The stanzas recorded.
        package let stanzas: Int
        /// The records' size, in bytes.
        package var bytes: Int { reads.reduce(0) { $0 + $1.count } }
        fileprivate var replayed = false

        fileprivate init(client: TLSMemoryStream, reads: [[UInt8]], stanzas: Int) {
            self.client = client
            self.reads = reads
            self.stanzas = stanzas
        }
    }

    /// What a replay produced.
    package struct Outcome: Sendable {
        /// Upstream messages decoded (and acked).
        package var messages = 0
        /// Stanzas that were not upstream messages, or not usable.
        package var others = 0
        /// Plaintext bytes of the acks written, and the TLS bytes they became.
        package var ackBytes = 0
        package var ackRecordBytes = 0
        /// The COPY rows, when kept (`keepingRows`); their byte count in any case.
        package var copyRows: [UInt8] = []
        package var copyBytes = 0
        /// The acks written, when kept (`keepingRows`).
        package var acks: [UInt8] = []

        /// Nothing yet (a sum of replays starts here).
        package init() {}

        /// Adds `other`'s counts (its kept rows and acks too).
        package mutating func add(_ other: Outcome) {
            messages += other.messages
            others += other.others
            ackBytes += other.ackBytes
            ackRecordBytes += other.ackRecordBytes
            copyBytes += other.copyBytes
            copyRows += other.copyRows
            acks += other.acks
        }
    }

    /// Encrypts `stanzas` as a CCS server sends them on a restarted stream: its stream
    /// header, then windows of `window` stanzas (CCS's 100 unacked messages per connection),
    /// each window queued together and written as TLS records of at most 16 KiB, as a
    /// stream loop coalesces them.
    /// - Parameters:
    ///   - server: the server's TLS context; `client` the worker's, trusting it as `serverName`.
    package static func record(stanzas: [String], window: Int = 100, server: TLSContext, client: TLSContext,
                               serverName: String) throws -> Recording {
        let clientEnd = try TLSMemoryStream(context: client, role: .client(serverName: serverName))
        let serverEnd = try TLSMemoryStream(context: server, role: .server)
        try TLSMemoryStream.handshake(client: clientEnd, server: serverEnd)
        let header = "<stream:stream from=\"gcm.googleapis.com\" id=\"floor\" version=\"1.0\" "
            + "xmlns:stream=\"http://etherx.jabber.org/streams\" xmlns=\"jabber:client\">"
        var reads: [[UInt8]] = []
        var start = 0
        var pending = Array(header.utf8)
        while start < stanzas.count {
            let end = min(stanzas.count, start + max(1, window))
            for stanza in stanzas[start..<end] { pending.append(contentsOf: stanza.utf8) }
            var offset = 0
            while offset < pending.count {
                let length = min(StreamLoop.recordSize, pending.count - offset)
                try pending.withUnsafeBytes { try serverEnd.write(UnsafeRawBufferPointer(rebasing: $0[offset..<(offset + length)])) }
                offset += length
            }
            reads.append(serverEnd.takeRecords())
            pending.removeAll(keepingCapacity: true)
            start = end
        }
        return Recording(client: clientEnd, reads: reads, stanzas: stanzas.count)
    }

    /// Replays `recording` through the receive path, on this thread. A recording replays
    /// once (its client end has read its records then).
    /// - Parameter keepingRows: keep the COPY rows and the acks in the outcome (tests);
    ///   without it only their sizes are counted, as a socket and a connection would take them.
    /// - Throws: `TransportError` when a record cannot be decrypted, `XMLStreamError` when
    ///   the stream does not parse.
    package static func replay(_ recording: Recording, keepingRows: Bool = false) throws -> Outcome {
        precondition(!recording.replayed, "a floor recording replays once")
        recording.replayed = true
        let parser = XMLStreamParser()
        let interceptor = CCSInterceptor.immediateWithoutConnection()
        var outcome = Outcome()
        var buffer = [UInt8](repeating: 0, count: StreamLoop.recordSize)
        var acks: [UInt8] = []
        var rows: [UInt8] = []
        for read in recording.reads {
            recording.client.receive(read)
            while true {
                let count = try buffer.withUnsafeMutableBytes { try recording.client.read(into: $0) }
                if count == 0 { break }
                let (events, failure) = buffer.withUnsafeBytes { parser.parse(UnsafeRawBufferPointer(rebasing: $0.prefix(count))) }
                if let failure { throw failure }
                for event in events {
                    guard case .stanza(let stanza) = event else { continue }
                    let interception = interceptor.intercept(stanza)
                    if let reply = interception.reply { acks.append(contentsOf: reply.utf8) }
                    guard case .upstream(let arrival)? = interception.inbound else {
                        outcome.others += 1
                        continue
                    }
                    outcome.messages += 1
                    PostgresCopyText.append(row: [.text(arrival.messageID), .text(arrival.from),
                                                  arrival.message.category.map { .text($0) } ?? .null,
                                                  .jsonb(arrival.message.dataJSON), .timestamptz(arrival.receivedAt)],
                                            to: &rows)
                }
            }
            interceptor.didInterceptRead()
            if !acks.isEmpty {
                try acks.withUnsafeBytes { try recording.client.write($0) }
                outcome.ackBytes += acks.count
                outcome.ackRecordBytes += recording.client.discardRecords()
                if keepingRows { outcome.acks.append(contentsOf: acks) }
                acks.removeAll(keepingCapacity: true)
            }
            outcome.copyBytes += rows.count
            if keepingRows { outcome.copyRows.append(contentsOf: rows) }
            rows.removeAll(keepingCapacity: true)
        }
        return outcome
    }
}
