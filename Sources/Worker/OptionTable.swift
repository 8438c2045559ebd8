import Foundation

/// The options of one command, in the order help lists them.
///
/// Parsing takes `--flag value` and `--flag=value`, switches without a value, and the
/// environment variable of every option not given as a flag. Flags win, also over another
/// option's variable: every value from the environment is applied first, then every flag
/// (so `--server-key-file` beats `FCM_SERVER_KEY`). An empty environment variable counts
/// as unset; an empty flag value (`--connections=`) is an error. `-h` and `--help` anywhere
/// ask for help instead.
public struct OptionTable<Settings>: Sendable {
    public var options: [CommandOption<Settings>]
    /// Options parsed like the others but not listed one by one in help: the settings of
    /// another command that this one takes too (a maintenance command takes every setting
    /// of `run`, so that it builds the application as `run` does).
    public var unlisted: [CommandOption<Settings>]
    /// The line help shows for the unlisted options.
    public var unlistedNote: String?
    /// Runs after the options are applied: checks what is required and how settings go
    /// together (throws `ConfigurationError`).
    public let finish: @Sendable (inout Settings) throws(ConfigurationError) -> Void

    public init(_ options: [CommandOption<Settings>], unlisted: [CommandOption<Settings>] = [], unlistedNote: String? = nil,
                finish: @escaping @Sendable (inout Settings) throws(ConfigurationError) -> Void = { _ throws(ConfigurationError) in }) {
        self.options = options
        self.unlisted = unlisted
        self.unlistedNote = unlistedNote
        self.finish = finish
    }

    /// What parsing a command line came to.
    public enum Outcome<Parsed> {
        case parsed(Parsed, positional: [String])
        /// `-h` or `--help` was given.
        case helpRequested
    }

    /// Applies `arguments` (then `environment`) to `settings`. Arguments that are not
    /// options (they do not start with `-`) are handed back in order as positional ones.
    /// - Throws: `ConfigurationError` naming the first unknown option, missing value or
    ///   invalid setting.
    public func parse(_ arguments: [String], environment: [String: String],
                      into settings: Settings) throws(ConfigurationError) -> Outcome<Settings> {
        var settings = settings
        var given: [String: String] = [:]
        var positional: [String] = []
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            index += 1
            if argument == "-h" || argument == "--help" { return .helpRequested }
            guard argument.hasPrefix("-"), argument != "-" else {
                positional.append(argument)
                continue
            }
            var flag = argument, value: String?
            if let equals = argument.firstIndex(of: "=") {
                flag = String(argument[..<equals])
                value = String(argument[argument.index(after: equals)...])
            }
            guard let option = options.first(where: { $0.flag == flag }) ?? unlisted.first(where: { $0.flag == flag }) else {
                throw ConfigurationError("unknown option \(flag) (see --help)")
            }
            if option.placeholder == nil {
                if value == nil { value = "1" }
            } else if value == nil {
                guard index < arguments.count else { throw ConfigurationError("\(flag) needs a value") }
                value = arguments[index]
                index += 1
            }
            guard value?.isEmpty == false else { throw ConfigurationError("\(flag) is given an empty value: give it one, or leave it out") }
            given[flag] = value
        }
        let all = options + unlisted
        for option in all where given[option.flag] == nil {
            guard let variable = option.environment, let text = environment[variable], !text.isEmpty else { continue }
            try option.apply(&settings, text)
        }
        for option in all {
            guard let text = given[option.flag] else { continue }
            try option.apply(&settings, text)
        }
        try finish(&settings)
        return .parsed(settings, positional: positional)
    }

    /// The options as help lists them: flag and value, environment variable, default, and
    /// what it sets, wrapped to 100 columns.
    public var help: String {
        let left = options.map { "  \($0.flag)\($0.placeholder.map { " \($0)" } ?? "")" }
        let width = min((left.map(\.count).max() ?? 0) + 2, 34)
        var lines: [String] = []
        for (option, flag) in zip(options, left) {
            var text = option.help
            if let variable = option.environment { text += " [\(variable)]" }
            text += " (default: \(option.defaultDescription))"
            let prefix = flag.count >= width ? flag + "\n" + String(repeating: " ", count: width) : flag.padding(toLength: width, withPad: " ", startingAt: 0)
            lines.append(prefix + Self.wrap(text, width: 100 - width).joined(separator: "\n" + String(repeating: " ", count: width)))
        }
        if let unlistedNote, !unlisted.isEmpty {
            lines.append(contentsOf: Self.wrap(unlistedNote, width: 98).map { "  " + $0 })
        }
        return lines.joined(separator: "\n")
    }

    /// The options as a Markdown table (flag, environment, default, meaning): README's.
    public var markdownTable: String {
        var rows = ["| flag | environment | default | what it sets |", "| --- | --- | --- | --- |"]
        for option in options {
            let flag = "`\(option.flag)\(option.placeholder.map { " \($0)" } ?? "")`".replacingOccurrences(of: "|", with: "\\|")
            let variable = option.environment.map { "`\($0)`" } ?? ""
            rows.append("| \(flag) | \(variable) | \(option.defaultDescription.replacingOccurrences(of: "|", with: "\\|")) | "
                        + "\(option.help.replacingOccurrences(of: "|", with: "\\|")) |")
        }
        return rows.joined(separator: "\n")
    }

    private static func wrap(_ text: String, width: Int) -> [String] {
        var lines: [String] = []
        var line = ""
        for word in text.split(separator: " ") {
            if !line.isEmpty && line.count + 1 + word.count > width {
                lines.append(line)
                line = ""
            }
            line += (line.isEmpty ? "" : " ") + word
        }
        if !line.isEmpty { lines.append(line) }
        return lines
    }
}
