internal import CLibPQ
import Foundation

/// A PostgreSQL connection string (a `postgresql://` URL or `key=value` conninfo), parsed
/// by libpq itself, so that what is printed and what is connected to are the same.
///
/// `description` shows every part but the password; `redact` removes the password (and
/// URL or keyword passwords in general) from any text, such as a libpq error message.
public struct PostgresConnectionString: Sendable, CustomStringConvertible {
    /// The keywords libpq parsed, in its order, with their values (only those set).
    public let parameters: [(keyword: String, value: String)]

    /// Parses `text`.
    /// - Throws: `PostgresError` of kind `.configuration` naming what libpq refused, with
    ///   the password (and any quoted part of libpq's message that shows some of it) left out.
    public init(_ text: String) throws(PostgresError) {
        var error: UnsafeMutablePointer<CChar>?
        guard let options = PQconninfoParse(text, &error) else {
            let message = error.map { String(cString: $0) } ?? "libpq could not parse it"
            if let error { PQfreemem(error) }
            throw PostgresError(kind: .configuration,
                                message: "the database URL cannot be parsed: \(Self.redactParseError(message, of: text))")
        }
        defer { PQconninfoFree(options) }
        var parameters: [(String, String)] = []
        var cursor = options
        while let keyword = cursor.pointee.keyword {
            if let value = cursor.pointee.val { parameters.append((String(cString: keyword), String(cString: value))) }
            cursor += 1
        }
        self.parameters = parameters
        // libpq checks ports only when connecting: a bad one is a configuration error now.
        if let ports = self["port"], !ports.split(separator: ",", omittingEmptySubsequences: false)
            .allSatisfy({ $0.isEmpty || Int($0).map { (1...65535).contains($0) } == true }) {
            throw PostgresError(kind: .configuration, message: "the database URL's port is not a number from 1 to 65535")
        }
    }

    /// The value of `keyword`, if set.
    public subscript(keyword: String) -> String? { parameters.first { $0.keyword == keyword }?.value }

    /// These parameters with `defaults` added where the string did not set them.
    func adding(_ defaults: [(String, String)]) -> [(keyword: String, value: String)] {
        parameters + defaults.filter { self[$0.0] == nil }
    }

    /// `key=value` pairs without the password (`password=***` when one was given).
    public var description: String {
        parameters.map { keyword, value in
            keyword == "password" ? "password=***" : "\(keyword)=\(Self.quote(value))"
        }.joined(separator: " ")
    }

    /// `text` with any URL or keyword password (`://user:secret@`, `password=secret`)
    /// replaced by `***`, on one line. Only where a password is written as part of a
    /// connection string: the password's characters elsewhere are left alone, so that a
    /// short one (`fcm`) cannot mangle a server's message, a statement's name or a label.
    /// libpq's and the server's messages never quote the password itself.
    public func redact(_ text: String) -> String {
        Self.redactPatterns(text)
    }

    /// Replaces URL and keyword passwords in `text` (`://user:secret@`, `password=secret`,
    /// `password = 'two words'`), and joins its lines.
    static func redactPatterns(_ text: String) -> String {
        var text = text.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }.joined(separator: " ")
        let patterns = [
            (#"://([^:@/\s]*):[^@\s]*@"#, "://$1:***@"),
            (#"(password\s*=\s*)'(?:[^'\\]|\\.)*'"#, "$1***"),
            (#"(password\s*=\s*)[^'\s&]\S*?(?=[\s&]|$)"#, "$1***"),
        ]
        for (pattern, template) in patterns {
            guard let expression = try? NSRegularExpression(pattern: pattern, options: [.caseInsensitive]) else { continue }
            text = expression.stringByReplacingMatches(in: text, range: NSRange(text.startIndex..., in: text), withTemplate: template)
        }
        return text
    }

    /// libpq's message about a string it could not parse, on one line, without the password:
    /// a double-quoted part that shows any of what looks like the password in `text` (a
    /// URL's `user:password@`, a `password=` value) becomes `"…"`, the others stay, so that
    /// the message still says what is wrong (`missing "=" after "dbname"`). With no
    /// password to be seen in `text`, nothing is left out.
    static func redactParseError(_ message: String, of text: String) -> String {
        let line = redactPatterns(message)
        var secrets: [String] = []
        let patterns = [#"://[^:@/\s]*:([^@\s]*)@"#, #"password\s*=\s*'((?:[^'\\]|\\.)*)'"#, #"password\s*=\s*([^'\s&]+)"#]
        for pattern in patterns {
            guard let expression = try? NSRegularExpression(pattern: pattern, options: [.caseInsensitive]) else { continue }
            for match in expression.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
                if let range = Range(match.range(at: 1), in: text), !text[range].isEmpty { secrets.append(String(text[range])) }
            }
        }
        guard !secrets.isEmpty, let quoted = try? NSRegularExpression(pattern: #""([^"]*)""#) else { return line }
        var result = line
        for match in quoted.matches(in: line, range: NSRange(line.startIndex..., in: line)).reversed() {
            guard let whole = Range(match.range, in: line), let inner = Range(match.range(at: 1), in: line) else { continue }
            let part = String(line[inner])
            let showsSecret = secrets.contains { secret in
                part.contains(secret) || (part.count >= 3 && secret.contains(part))
                    || part.split(whereSeparator: \.isWhitespace).contains { $0.count >= 3 && secret.contains($0) }
            }
            if showsSecret, let target = Range(NSRange(whole, in: line), in: result) { result.replaceSubrange(target, with: "\"…\"") }
        }
        return result
    }

    private static func quote(_ value: String) -> String {
        guard value.isEmpty || value.contains(where: { $0 == " " || $0 == "'" || $0 == "\\" }) else { return value }
        return "'" + value.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "'", with: "\\'") + "'"
    }
}
