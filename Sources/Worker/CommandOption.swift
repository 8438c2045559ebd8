import Runtime
import Upstream

/// One setting of a command: its flag, environment variable, default, help text, and how
/// its text is parsed into the settings. Options make up an `OptionTable`, from which a
/// command gets its parsing, its `--help` and the README's table.
public struct CommandOption<Settings>: Sendable {
    /// `--sender-id`.
    public let flag: String
    /// `FCM_SENDER_ID`, or nil for a flag without one.
    public let environment: String?
    /// What the value looks like in help (`ID`, `SECONDS`); nil for a switch, which takes
    /// no value on the command line (`1`/`true`/`yes` or `0`/`false`/`no` in the environment).
    public let placeholder: String?
    /// The default, as help shows it (`1`, `required`, `./fcm-worker.spool`).
    public let defaultDescription: String
    /// One sentence on what it sets.
    public let help: String
    let apply: @Sendable (inout Settings, String) throws(ConfigurationError) -> Void

    /// - Parameter apply: stores the (non-empty) text in the settings, or throws a
    ///   `ConfigurationError` naming the option and what it expects.
    public init(_ flag: String, environment: String? = nil, placeholder: String?, default defaultDescription: String,
                help: String, apply: @escaping @Sendable (inout Settings, String) throws(ConfigurationError) -> Void) {
        self.flag = flag
        self.environment = environment
        self.placeholder = placeholder
        self.defaultDescription = defaultDescription
        self.help = help
        self.apply = apply
    }

    /// A switch: present on the command line means on.
    public static func toggle(_ flag: String, environment: String? = nil, default defaultDescription: String = "off", help: String,
                              apply: @escaping @Sendable (inout Settings, Bool) -> Void) -> CommandOption {
        CommandOption(flag, environment: environment, placeholder: nil, default: defaultDescription, help: help) { settings, text throws(ConfigurationError) in
            switch text.lowercased() {
            case "1", "true", "yes", "on": apply(&settings, true)
            case "0", "false", "no", "off": apply(&settings, false)
            default: throw ConfigurationError("invalid \(environment ?? flag) \(text): expected 1 or 0")
            }
        }
    }

    /// A duration in seconds (more than 0, or at least `minimum` when given; at most a
    /// day), stored at `keyPath`; `name` says what it is in errors.
    public static func seconds(_ flag: String, environment: String?, default defaultDescription: String, help: String, name: String,
                               minimum: Duration? = nil,
                               _ keyPath: any WritableKeyPath<Settings, Duration> & Sendable) -> CommandOption {
        CommandOption(flag, environment: environment, placeholder: "SECONDS", default: defaultDescription, help: help) { settings, text throws(ConfigurationError) in
            settings[keyPath: keyPath] = try parseSeconds(text, name: name, minimum: minimum)
        }
    }

    /// A whole number in `range`, stored at `keyPath`.
    public static func integer(_ flag: String, environment: String?, default defaultDescription: String, help: String, name: String,
                               range: ClosedRange<Int>, _ keyPath: any WritableKeyPath<Settings, Int> & Sendable) -> CommandOption {
        CommandOption(flag, environment: environment, placeholder: "N", default: defaultDescription, help: help) { settings, text throws(ConfigurationError) in
            settings[keyPath: keyPath] = try parseInteger(text, name: name, range: range)
        }
    }

    /// A text stored as it is at `keyPath` (a path, a name).
    public static func text(_ flag: String, environment: String?, placeholder: String, default defaultDescription: String, help: String,
                            _ keyPath: any WritableKeyPath<Settings, String> & Sendable) -> CommandOption {
        CommandOption(flag, environment: environment, placeholder: placeholder, default: defaultDescription, help: help) { settings, text throws(ConfigurationError) in
            settings[keyPath: keyPath] = text
        }
    }

    /// Seconds, more than 0 (or at least `minimum`) and at most a day.
    public static func parseSeconds(_ text: String, name: String, minimum: Duration? = nil) throws(ConfigurationError) -> Duration {
        guard let seconds = Double(text), seconds > 0, seconds <= 86_400 else {
            throw ConfigurationError("invalid \(name) \(text): expected seconds, more than 0")
        }
        let duration = Duration.milliseconds(Int64((seconds * 1000).rounded()))
        if let minimum, duration < minimum {
            throw ConfigurationError("invalid \(name) \(text): expected at least \(minimum.formattedSeconds)")
        }
        return duration
    }

    /// A whole number in `range`.
    public static func parseInteger(_ text: String, name: String, range: ClosedRange<Int>, expecting: String? = nil) throws(ConfigurationError) -> Int {
        guard let value = Int(text), range.contains(value) else {
            throw ConfigurationError("invalid \(name) \(text): expected \(expecting ?? "\(range.lowerBound) to \(range.upperBound)")")
        }
        return value
    }

    /// The same option for other settings that hold these ones at `keyPath`.
    public func lifted<Outer>(to keyPath: any WritableKeyPath<Outer, Settings> & Sendable) -> CommandOption<Outer> {
        let apply = self.apply
        return CommandOption<Outer>(flag, environment: environment, placeholder: placeholder, default: defaultDescription,
                                    help: help) { outer, text throws(ConfigurationError) in
            try apply(&outer[keyPath: keyPath], text)
        }
    }
}
