import Foundation
import Synchronization

/// Line-oriented logging to standard error, one entry per line whatever the message holds
/// (line breaks and other control characters are escaped), as text or JSON:
///
///     2026-11-30T20:00:00.123Z warning [pipeline] message up-1 failed, retrying message_id=up-1
///     {"time":"2026-11-30T20:00:00.123Z","level":"warning","label":"pipeline","message":"…","message_id":"up-1"}
///
/// Levels and metadata are shaped like swift-log's (`Logger.Level`, string metadata), so a
/// handler package can bridge the two. Safe from any task; lines never interleave.
public struct Logger: Sendable {
    /// swift-log's levels, in order.
    public enum Level: Int, Sendable, Comparable, CaseIterable, CustomStringConvertible {
        case trace, debug, info, notice, warning, error, critical
        public static func < (a: Level, b: Level) -> Bool { a.rawValue < b.rawValue }
        public var description: String {
            switch self {
            case .trace: "trace"
            case .debug: "debug"
            case .info: "info"
            case .notice: "notice"
            case .warning: "warning"
            case .error: "error"
            case .critical: "critical"
            }
        }

        /// The level named `name` (`trace` … `critical`).
        public init?(name: String) {
            guard let level = Level.allCases.first(where: { $0.description == name.lowercased() }) else { return nil }
            self = level
        }
    }

    /// How entries are written.
    public enum Format: String, Sendable, CaseIterable {
        /// `TIME LEVEL [label] message key=value…`
        case text
        /// One JSON object per line: `time`, `level`, `label`, `message`, then the metadata.
        case json
    }

    /// Key-value context of an entry (`message_id`, `connection`).
    public typealias Metadata = [String: String]

    public var label: String
    public var minimumLevel: Level
    public var format: Format
    /// Added to every entry of this logger.
    public var metadata: Metadata = [:]
    private let sink: @Sendable (String) -> Void

    /// A logger writing to standard error.
    public init(label: String, minimumLevel: Level = .info, format: Format = .text) {
        self.init(label: label, minimumLevel: minimumLevel, format: format) { line in
            Logger.standardErrorLock.withLock { _ in
                FileHandle.standardError.write(Data((line + "\n").utf8))
            }
        }
    }

    /// A logger handing each formatted line (without its line break) to `sink`.
    public init(label: String, minimumLevel: Level = .info, format: Format = .text, sink: @escaping @Sendable (String) -> Void) {
        self.label = label
        self.minimumLevel = minimumLevel
        self.format = format
        self.sink = sink
    }

    private static let standardErrorLock = BlockingLock(())

    /// The same sink and settings under another label.
    public func labeled(_ label: String) -> Logger {
        var copy = self
        copy.label = label
        return copy
    }

    /// The same logger with `metadata` added to every entry.
    public func with(_ metadata: Metadata) -> Logger {
        var copy = self
        copy.metadata.merge(metadata) { $1 }
        return copy
    }

    public func log(_ level: Level, _ message: @autoclosure () -> String, metadata: Metadata = [:]) {
        guard level >= minimumLevel else { return }
        let fields = self.metadata.isEmpty ? metadata : self.metadata.merging(metadata) { $1 }
        sink(Self.entry(level: level, label: label, message: message(), metadata: fields, as: format, at: Date()))
    }

    public func trace(_ message: @autoclosure () -> String, metadata: Metadata = [:]) { log(.trace, message(), metadata: metadata) }
    public func debug(_ message: @autoclosure () -> String, metadata: Metadata = [:]) { log(.debug, message(), metadata: metadata) }
    public func info(_ message: @autoclosure () -> String, metadata: Metadata = [:]) { log(.info, message(), metadata: metadata) }
    public func notice(_ message: @autoclosure () -> String, metadata: Metadata = [:]) { log(.notice, message(), metadata: metadata) }
    public func warning(_ message: @autoclosure () -> String, metadata: Metadata = [:]) { log(.warning, message(), metadata: metadata) }
    public func error(_ message: @autoclosure () -> String, metadata: Metadata = [:]) { log(.error, message(), metadata: metadata) }
    public func critical(_ message: @autoclosure () -> String, metadata: Metadata = [:]) { log(.critical, message(), metadata: metadata) }

    /// One entry as the line it is written as.
    public static func entry(level: Level, label: String, message: String, metadata: Metadata, as format: Format, at date: Date) -> String {
        let time = timestamp(date)
        switch format {
        case .text:
            var line = "\(time) \(level.description.padding(toLength: 7, withPad: " ", startingAt: 0)) [\(label)] "
            appendEscaped(message, to: &line, quoting: false)
            for (key, value) in metadata.sorted(by: { $0.key < $1.key }) {
                line += " \(key)="
                let plain = !value.isEmpty && value.unicodeScalars.allSatisfy { $0.value > 0x20 && $0 != "\"" && $0 != "\\" && $0.value != 0x7F }
                if plain { line += value } else { appendEscaped(value, to: &line, quoting: true) }
            }
            return line
        case .json:
            var line = "{\"time\":\"\(time)\",\"level\":\"\(level.description)\",\"label\":"
            appendEscaped(label, to: &line, quoting: true)
            line += ",\"message\":"
            appendEscaped(message, to: &line, quoting: true)
            for (key, value) in metadata.sorted(by: { $0.key < $1.key }) where !["time", "level", "label", "message"].contains(key) {
                line += ","
                appendEscaped(key, to: &line, quoting: true)
                line += ":"
                appendEscaped(value, to: &line, quoting: true)
            }
            return line + "}"
        }
    }

    /// `text` with `"`, `\` (when quoting) and control characters escaped JSON-style, so that
    /// an entry never spans lines.
    private static func appendEscaped(_ text: String, to line: inout String, quoting: Bool) {
        if quoting { line += "\"" }
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\n": line += "\\n"
            case "\r": line += "\\r"
            case "\t": line += "\\t"
            case "\"" where quoting: line += "\\\""
            case "\\" where quoting: line += "\\\\"
            default:
                if scalar.value < 0x20 || scalar.value == 0x7F || scalar == "\u{2028}" || scalar == "\u{2029}" {
                    line += String(format: "\\u%04x", scalar.value)
                } else {
                    line.unicodeScalars.append(scalar)
                }
            }
        }
        if quoting { line += "\"" }
    }

    /// `2026-11-30T20:00:00.123Z`: ISO 8601, UTC, milliseconds.
    static func timestamp(_ date: Date) -> String {
        let milliseconds = Int64((date.timeIntervalSince1970 * 1000).rounded(.down))
        var seconds = time_t(milliseconds / 1000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        return String(format: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1, Int(parts.tm_mday),
                      Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec), Int(milliseconds % 1000))
    }
}
