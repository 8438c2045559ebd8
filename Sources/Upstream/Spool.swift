import Foundation
import Runtime
#if canImport(Glibc)
import Glibc
#endif

/// A local file for messages that were acked but could not be committed before shutdown
/// (the database was down or hung). The next start replays it before reading from CCS.
///
/// - One process per spool: `lock()` takes an exclusive lock (`<path>.lock`) for the
///   life of the process; a second worker on the same path fails at start.
/// - Records are appended with `O_APPEND` in one write and fsynced; the file's folder is
///   fsynced after the file is created or removed, so a crash never loses the file itself.
/// - Each record is one line, `CRC32 JSON`: the checksum (8 hex digits) of the JSON text
///   `{"connection":…,"payload":…,"received_at":…}` holding the payload as received.
///   A torn or corrupt record (a crash in the middle of a write, a damaged disk) is set
///   aside in `<path>.corrupt` (and the spool rewritten without it, renamed into place),
///   never deleted and never blocking start-up.
///
/// Replays are safe to repeat: handling is de-duplicated by message id.
package final class Spool: Sendable {
    package let path: String
    private let lockDescriptor = BlockingLock<Int32?>(nil)

    package init(path: String) {
        self.path = path
    }

    deinit {
        if let fd = lockDescriptor.withLock({ $0 }) { close(fd) }
    }

    package struct Entry: Codable, Sendable, Equatable {
        package var connection: String
        package var payload: String
        package var receivedAt: Double

        package init(connection: String, payload: String, receivedAt: Double) {
            self.connection = connection
            self.payload = payload
            self.receivedAt = receivedAt
        }

        enum CodingKeys: String, CodingKey {
            case connection, payload
            case receivedAt = "received_at"
        }
    }

    /// The folder the spool lives in.
    private var directory: String {
        let folder = (path as NSString).deletingLastPathComponent
        return folder.isEmpty ? "." : folder
    }

    /// Checks at start that the spool can be written, and takes the lock that makes this
    /// process its only writer (held until the process ends).
    /// - Throws: `ConfigurationError` (exit status 2) for a folder that does not exist or
    ///   cannot be written, or a spool another worker process holds.
    package func lock() throws(ConfigurationError) {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory), isDirectory.boolValue,
              access(directory, W_OK | X_OK) == 0 else {
            throw ConfigurationError("the spool file's folder \(directory) does not exist or is not writable (--spool-file \(path))")
        }
        if FileManager.default.fileExists(atPath: path), access(path, R_OK | W_OK) != 0 {
            throw ConfigurationError("the spool file \(path) cannot be read and written")
        }
        let fd = open(path + ".lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw ConfigurationError("cannot open the spool lock \(path).lock: \(String(cString: strerror(errno)))")
        }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            close(fd)
            throw ConfigurationError("the spool file \(path) is in use by another worker process: give each worker a spool of its own (--spool-file)")
        }
        lockDescriptor.withLock { $0 = fd }
    }

    /// Appends `entries` and flushes them to disk.
    func append(_ entries: [Entry]) throws {
        guard !entries.isEmpty else { return }
        let data = try Self.records(entries)
        let existed = FileManager.default.fileExists(atPath: path)
        try Self.append(data, to: path)
        if !existed { try syncDirectory() }
    }

    /// The spooled entries (empty when there is no spool). Records that are torn or fail
    /// their checksum are appended to `<path>.corrupt` and counted in `corruptRecords`.
    package func load() throws -> (entries: [Entry], corruptRecords: Int) {
        guard FileManager.default.fileExists(atPath: path) else { return ([], 0) }
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        let (entries, kept, corrupt, corruptCount) = Self.parse(data)
        if corruptCount > 0 {
            // Set aside first, then rewrite the spool without them (renamed into place).
            try Self.append(corrupt, to: path + ".corrupt")
            let rest = path + ".rewrite"
            try? FileManager.default.removeItem(atPath: rest)
            try Self.append(kept, to: rest)
            guard rename(rest, path) == 0 else { throw SpoolError("cannot replace \(path): \(String(cString: strerror(errno)))") }
            try syncDirectory()
        }
        return (entries, corruptCount)
    }

    /// Deletes the spool after a successful replay (the removal made durable).
    package func remove() throws {
        guard FileManager.default.fileExists(atPath: path) else { return }
        try FileManager.default.removeItem(atPath: path)
        try syncDirectory()
    }

    /// `entries` as spool records: `xxxxxxxx JSON\n` each, the CRC-32 of the JSON in hex.
    package static func records(_ entries: [Entry]) throws -> Data {
        var bytes: [UInt8] = []
        for entry in entries { appendRecord(entry, to: &bytes) }
        return Data(bytes)
    }

    /// Appends `entry` as one record to `bytes`. Written by hand rather than with
    /// `JSONEncoder` (the journal writes one record per message at full speed); the JSON
    /// is what `JSONDecoder` reads back as an `Entry` (FuzzTarget.spool checks the round trip).
    package static func appendRecord(_ entry: Entry, to bytes: inout [UInt8]) {
        // The checksum's place first, filled in once the JSON after it is written.
        let start = bytes.count
        bytes += "00000000 ".utf8
        bytes += #"{"connection":"#.utf8
        appendJSONString(entry.connection, to: &bytes)
        bytes += #","payload":"#.utf8
        appendJSONString(entry.payload, to: &bytes)
        bytes += #","received_at":"#.utf8
        bytes += (entry.receivedAt.isFinite ? "\(entry.receivedAt)" : "0").utf8
        bytes.append(UInt8(ascii: "}"))
        let checksum = bytes.withUnsafeBytes { CRC32.checksum(UnsafeRawBufferPointer(rebasing: $0[(start + 9)...])) }
        for (place, shift) in stride(from: 28, through: 0, by: -4).enumerated() {
            bytes[start + place] = hexDigits[Int((checksum >> UInt32(shift)) & 0xF)]
        }
        bytes.append(0x0A)
    }

    private static let hexDigits = Array("0123456789abcdef".utf8)

    /// `text` as a JSON string: quotes, backslashes and control characters escaped, the
    /// rest (UTF-8 included) as it is.
    private static func appendJSONString(_ text: String, to json: inout [UInt8]) {
        json.append(UInt8(ascii: "\""))
        var text = text
        text.withUTF8 { buffer in
            // Runs of bytes that need no escape go in at once.
            var clean = 0
            for (index, byte) in buffer.enumerated() where byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") {
                json.append(contentsOf: UnsafeBufferPointer(rebasing: buffer[clean..<index]))
                clean = index + 1
                switch byte {
                case UInt8(ascii: "\""): json += #"\""#.utf8
                case UInt8(ascii: "\\"): json += #"\\"#.utf8
                case 0x0A: json += #"\n"#.utf8
                case 0x0D: json += #"\r"#.utf8
                case 0x09: json += #"\t"#.utf8
                default:
                    json += #"\u00"#.utf8
                    json.append(hexDigits[Int(byte >> 4)])
                    json.append(hexDigits[Int(byte & 0xF)])
                }
            }
            json.append(contentsOf: UnsafeBufferPointer(rebasing: buffer[clean...]))
        }
        json.append(UInt8(ascii: "\""))
    }

    /// Splits a spool's bytes into its entries, the records worth keeping (as they were),
    /// and the torn or corrupt ones with their count.
    package static func parse(_ data: Data) -> (entries: [Entry], kept: Data, corrupt: Data, corruptCount: Int) {
        let decoder = JSONDecoder()
        var entries: [Entry] = []
        var kept = Data(), corrupt = Data()
        var corruptCount = 0
        var lines = data.split(separator: 0x0A, omittingEmptySubsequences: false)
        // The part after the last newline is a torn record unless it is empty.
        let torn = lines.removeLast()
        for line in lines where !line.isEmpty {
            if let entry = decode(line, with: decoder) {
                entries.append(entry)
                kept.append(line)
                kept.append(0x0A)
            } else {
                corrupt.append(line)
                corrupt.append(0x0A)
                corruptCount += 1
            }
        }
        if !torn.isEmpty {
            corrupt.append(torn)
            corrupt.append(0x0A)
            corruptCount += 1
        }
        return (entries, kept, corrupt, corruptCount)
    }

    /// A record line's entry, or nil when it is torn or fails its checksum.
    private static func decode(_ line: Data.SubSequence, with decoder: JSONDecoder) -> Entry? {
        guard line.count > 9, line[line.startIndex + 8] == UInt8(ascii: " "),
              let checksum = UInt32(String(decoding: line.prefix(8), as: UTF8.self), radix: 16) else { return nil }
        let json = line.dropFirst(9)
        guard CRC32.checksum(json) == checksum else { return nil }
        return try? decoder.decode(Entry.self, from: Data(json))
    }

    /// Appends `data` with one `O_APPEND` write (retrying partial writes) and fsyncs it.
    private static func append(_ data: Data, to path: String) throws {
        let fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw SpoolError("cannot open \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        try data.withUnsafeBytes { try writeAll($0, to: fd, path: path) }
        guard fsync(fd) == 0 else { throw SpoolError("cannot flush \(path) to disk: \(String(cString: strerror(errno)))") }
    }

    /// Writes all of `bytes` to `fd` (the file at `path`), retrying partial and
    /// interrupted writes. Shared with the journal.
    static func writeAll(_ bytes: UnsafeRawBufferPointer, to fd: Int32, path: String) throws {
        var offset = 0
        while offset < bytes.count {
            let written = write(fd, bytes.baseAddress! + offset, bytes.count - offset)
            if written < 0 {
                if errno == EINTR { continue }
                throw SpoolError("cannot write \(path): \(String(cString: strerror(errno)))")
            }
            offset += written
        }
    }

    /// Makes a file's creation or removal in the spool's folder durable.
    private func syncDirectory() throws {
        try Self.syncFolder(of: path)
    }

    /// Makes the creation or removal of the file at `path` durable (fsyncs its folder).
    /// Shared with the journal.
    static func syncFolder(of path: String) throws {
        let folder = (path as NSString).deletingLastPathComponent
        let directory = folder.isEmpty ? "." : folder
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw SpoolError("cannot open the folder \(directory): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw SpoolError("cannot flush the folder \(directory): \(String(cString: strerror(errno)))") }
    }
}

/// A spool file could not be written or read.
package struct SpoolError: Error, CustomStringConvertible {
    package let description: String
    init(_ description: String) { self.description = description }
}
