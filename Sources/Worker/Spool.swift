import Foundation

/// A local file for messages that were acked but could not be persisted before shutdown
/// (the database was unreachable). The next start replays it before reading from CCS.
///
/// One JSON object per line: `{"connection":…,"payload":…,"received_at":…}` with the
/// payload as received. Writes are fsynced; replays are safe to repeat (handling is
/// de-duplicated by message id).
public struct Spool: Sendable {
    public let path: String

    public init(path: String) {
        self.path = path
    }

    struct Entry: Codable, Sendable, Equatable {
        var connection: String
        var payload: String
        var receivedAt: Double

        enum CodingKeys: String, CodingKey {
            case connection, payload
            case receivedAt = "received_at"
        }
    }

    /// Fails at start, rather than when it is needed, when the spool cannot be written.
    func checkWritable() throws(ConfigurationError) {
        let directory = (path as NSString).deletingLastPathComponent.isEmpty ? "." : (path as NSString).deletingLastPathComponent
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory), isDirectory.boolValue,
              FileManager.default.isWritableFile(atPath: directory) else {
            throw ConfigurationError("the spool file's folder \(directory) does not exist or is not writable (--spool-file \(path))")
        }
    }

    /// Appends `entries` and flushes them to disk.
    func append(_ entries: [Entry]) throws {
        guard !entries.isEmpty else { return }
        let encoder = JSONEncoder()
        var data = Data()
        for entry in entries {
            data.append(try encoder.encode(entry))
            data.append(0x0A)
        }
        if !FileManager.default.fileExists(atPath: path) {
            guard FileManager.default.createFile(atPath: path, contents: nil, attributes: [.posixPermissions: 0o600]) else {
                throw CocoaError(.fileWriteNoPermission, userInfo: [NSFilePathErrorKey: path])
            }
        }
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        defer { try? handle.close() }
        try handle.seekToEnd()
        try handle.write(contentsOf: data)
        try handle.synchronize()
    }

    /// The spooled entries (empty when there is no spool). Unreadable lines are skipped
    /// and counted in `corruptLines`.
    func load() throws -> (entries: [Entry], corruptLines: Int) {
        guard FileManager.default.fileExists(atPath: path) else { return ([], 0) }
        let text = try String(contentsOfFile: path, encoding: .utf8)
        let decoder = JSONDecoder()
        var entries: [Entry] = []
        var corrupt = 0
        for line in text.split(separator: "\n") where !line.isEmpty {
            if let entry = try? decoder.decode(Entry.self, from: Data(line.utf8)) { entries.append(entry) } else { corrupt += 1 }
        }
        return (entries, corrupt)
    }

    /// Deletes the spool after a successful replay.
    func remove() throws {
        if FileManager.default.fileExists(atPath: path) { try FileManager.default.removeItem(atPath: path) }
    }
}
