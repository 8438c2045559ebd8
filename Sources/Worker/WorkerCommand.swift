import Foundation

/// A subcommand of a worker executable (`run`, `migrate`, …): what `help` says of it and
/// what it does. `WorkerMain` gives every executable its commands and their help.
public struct WorkerCommand: Sendable {
    /// `run`.
    public let name: String
    /// What follows the name in the usage line (`[options]`, `create NAME TOKEN... [options]`).
    public let synopsis: String
    /// One line on what it does.
    public let summary: String
    /// The help of its options (an `OptionTable`'s `help`), empty for none.
    public let options: String
    /// Its options as a Markdown table (`help COMMAND --markdown`), empty for none.
    public let optionsMarkdown: String
    /// Runs it with the arguments after its name; returns the exit status.
    public let run: @Sendable (_ arguments: [String], _ context: WorkerCommandContext) async -> Int32

    public init(name: String, synopsis: String = "[options]", summary: String, options: String = "", optionsMarkdown: String = "",
                run: @escaping @Sendable (_ arguments: [String], _ context: WorkerCommandContext) async -> Int32) {
        self.name = name
        self.synopsis = synopsis
        self.summary = summary
        self.options = options
        self.optionsMarkdown = optionsMarkdown
        self.run = run
    }

    /// The text of `PROGRAM help NAME` and `PROGRAM NAME --help`.
    public func help(program: String) -> String {
        var text = "usage: \(program) \(name) \(synopsis)\n\n\(summary)\n"
        if !options.isEmpty { text += "\noptions (flags win over the environment variables in brackets):\n\(options)\n" }
        return text
    }
}

/// What a command runs with: the executable's name (for messages), the environment, and
/// the help of the command running.
public struct WorkerCommandContext: Sendable {
    /// The executable's name, which prefixes every error line.
    public let program: String
    public let environment: [String: String]
    /// The command running (nil before one is chosen).
    public var command: WorkerCommand?

    public init(program: String, environment: [String: String], command: WorkerCommand? = nil) {
        self.program = program
        self.environment = environment
        self.command = command
    }

    /// Writes `PROGRAM: LINE` to standard error (one line: line breaks become spaces).
    public func printError(_ line: String) {
        let single = line.split(whereSeparator: \.isNewline).joined(separator: " ")
        FileHandle.standardError.write(Data("\(program): \(single)\n".utf8))
    }

    /// `printError(line)`, then `status` (2: an invalid setting).
    public func fail(_ line: String, status: Int32 = 2) -> Int32 {
        printError(line)
        return status
    }

    /// Parses a command's options: nil after printing help (`-h`) or an error, with the
    /// exit status in `status`.
    public func parse<Settings>(_ arguments: [String], with table: OptionTable<Settings>, into settings: Settings,
                                status: inout Int32) -> (Settings, [String])? {
        let name = command?.name ?? program
        do {
            switch try table.parse(arguments, environment: environment, into: settings) {
            case .parsed(let parsed, let positional): return (parsed, positional)
            case .helpRequested:
                print(command?.help(program: program) ?? table.help, terminator: "")
                status = 0
                return nil
            }
        } catch {
            // `run`'s messages are the worker's own: they need no prefix.
            status = fail(name == "run" ? error.description : "\(name): \(error.description)")
            return nil
        }
    }
}
