import Foundation
import Synchronization

/// Line-oriented logging to standard error: `2026-11-30T20:00:00.123Z info  [xmpp#1] text`.
/// Safe from any task; lines never interleave.
public struct Logger: Sendable {
    public enum Level: Int, Sendable, Comparable, CustomStringConvertible {
        case debug, info, warning, error
        public static func < (a: Level, b: Level) -> Bool { a.rawValue < b.rawValue }
        public var description: String {
            switch self {
            case .debug: "debug"
            case .info: "info"
            case .warning: "warn"
            case .error: "error"
            }
        }
    }

    public var label: String
    public var minimumLevel: Level
    private let sink: @Sendable (String) -> Void

    /// A logger writing to standard error.
    public init(label: String, minimumLevel: Level = .info) {
        self.init(label: label, minimumLevel: minimumLevel) { line in
            Logger.standardErrorLock.withLock { _ in
                FileHandle.standardError.write(Data((line + "\n").utf8))
            }
        }
    }

    /// A logger handing each formatted line to `sink` (tests collect them).
    public init(label: String, minimumLevel: Level = .info, sink: @escaping @Sendable (String) -> Void) {
        self.label = label
        self.minimumLevel = minimumLevel
        self.sink = sink
    }

    private static let standardErrorLock = Mutex(())

    /// The same sink under another label.
    public func labeled(_ label: String) -> Logger {
        var copy = self
        copy.label = label
        return copy
    }

    public func log(_ level: Level, _ message: @autoclosure () -> String) {
        guard level >= minimumLevel else { return }
        let stamp = Date().formatted(.iso8601.year().month().day().time(includingFractionalSeconds: true))
        sink("\(stamp) \(level.description.padding(toLength: 5, withPad: " ", startingAt: 0)) [\(label)] \(message())")
    }

    public func debug(_ message: @autoclosure () -> String) { log(.debug, message()) }
    public func info(_ message: @autoclosure () -> String) { log(.info, message()) }
    public func warning(_ message: @autoclosure () -> String) { log(.warning, message()) }
    public func error(_ message: @autoclosure () -> String) { log(.error, message()) }
}
