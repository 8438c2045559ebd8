import Foundation

/// The YAML the Kubernetes manifests in `deploy/kubernetes/` are written in, read for the
/// tests that check them: block mappings and block sequences by indentation, plain, single-
/// and double-quoted scalars, flow sequences of scalars (`["a", "b"]`), comments. Anything
/// else (anchors, block scalars, flow mappings, several documents) is an error, so that a
/// manifest the tests cannot read fails them instead of being skipped.
indirect enum ManifestYAML: Equatable, CustomStringConvertible {
    case scalar(String)
    case list([ManifestYAML])
    case map([(key: String, value: ManifestYAML)])

    struct Unreadable: Error, CustomStringConvertible {
        let line: Int
        let reason: String
        var description: String { "line \(line): \(reason)" }
    }

    static func == (left: ManifestYAML, right: ManifestYAML) -> Bool {
        switch (left, right) {
        case (.scalar(let a), .scalar(let b)): a == b
        case (.list(let a), .list(let b)): a == b
        case (.map(let a), .map(let b)): a.map(\.key) == b.map(\.key) && a.map(\.value) == b.map(\.value)
        default: false
        }
    }

    var description: String {
        switch self {
        case .scalar(let text): text
        case .list(let items): "[" + items.map(\.description).joined(separator: ", ") + "]"
        case .map(let pairs): "{" + pairs.map { "\($0.key): \($0.value)" }.joined(separator: ", ") + "}"
        }
    }

    /// The value under `key` of a mapping (nil for anything else).
    subscript(key: String) -> ManifestYAML? {
        guard case .map(let pairs) = self else { return nil }
        return pairs.first { $0.key == key }?.value
    }

    /// The value at a path of keys (`"spec.template.spec"`).
    subscript(path path: String) -> ManifestYAML? {
        path.split(separator: ".").reduce(Optional(self)) { node, key in node?[String(key)] }
    }

    var text: String? { if case .scalar(let text) = self { text } else { nil } }
    var items: [ManifestYAML] { if case .list(let items) = self { items } else { [] } }

    private struct Line {
        let number: Int
        let indent: Int
        let content: String
    }

    static func parse(_ source: String) throws -> ManifestYAML {
        var lines: [Line] = []
        for (index, raw) in source.components(separatedBy: "\n").enumerated() {
            let content = stripComment(raw)
            guard !content.trimmingCharacters(in: .whitespaces).isEmpty else { continue }
            let indent = content.prefix { $0 == " " }.count
            if content.contains("\t") { throw Unreadable(line: index + 1, reason: "a tab") }
            let body = String(content.dropFirst(indent)).trimmingCharacters(in: .whitespaces)
            if body == "---" || body.hasPrefix("&") || body.contains(": &") || body.contains(": *") || body.hasSuffix("|") || body.hasSuffix(">") {
                throw Unreadable(line: index + 1, reason: "unsupported YAML: \(body)")
            }
            lines.append(Line(number: index + 1, indent: indent, content: body))
        }
        var position = 0
        let node = try block(&lines, &position, indent: lines.first?.indent ?? 0)
        if position < lines.count { throw Unreadable(line: lines[position].number, reason: "unexpected indentation") }
        return node
    }

    private static func block(_ lines: inout [Line], _ position: inout Int, indent: Int) throws -> ManifestYAML {
        guard position < lines.count else { return .scalar("") }
        if lines[position].content.hasPrefix("- ") || lines[position].content == "-" {
            var items: [ManifestYAML] = []
            while position < lines.count, lines[position].indent == indent, lines[position].content.hasPrefix("-") {
                let line = lines[position]
                let rest = String(line.content.dropFirst()).trimmingCharacters(in: .whitespaces)
                if rest.isEmpty {
                    position += 1
                    guard position < lines.count, lines[position].indent > indent else { items.append(.scalar("")); continue }
                    items.append(try block(&lines, &position, indent: lines[position].indent))
                } else {
                    // The item's first line, as if it stood on its own line two columns in.
                    lines[position] = Line(number: line.number, indent: indent + 2, content: rest)
                    if isPair(rest) {
                        items.append(try block(&lines, &position, indent: indent + 2))
                    } else {
                        items.append(try scalar(rest, line: line.number))
                        position += 1
                    }
                }
            }
            return .list(items)
        }
        var pairs: [(key: String, value: ManifestYAML)] = []
        while position < lines.count, lines[position].indent == indent {
            let line = lines[position]
            guard isPair(line.content), let colon = separator(in: line.content) else {
                throw Unreadable(line: line.number, reason: "expected key: value, found \(line.content)")
            }
            let key = try unquote(String(line.content[..<colon]).trimmingCharacters(in: .whitespaces), line: line.number)
            let value = String(line.content[line.content.index(after: colon)...]).trimmingCharacters(in: .whitespaces)
            if pairs.contains(where: { $0.key == key }) { throw Unreadable(line: line.number, reason: "\(key) twice") }
            position += 1
            if !value.isEmpty {
                pairs.append((key, try scalar(value, line: line.number)))
            } else if position < lines.count, lines[position].indent > indent
                        || (lines[position].indent == indent && lines[position].content.hasPrefix("- ")) {
                pairs.append((key, try block(&lines, &position, indent: lines[position].indent)))
            } else {
                pairs.append((key, .scalar("")))
            }
        }
        if position < lines.count, lines[position].indent > indent {
            throw Unreadable(line: lines[position].number, reason: "unexpected indentation")
        }
        return .map(pairs)
    }

    /// Where `key: value` splits (a colon followed by a space or the end, outside quotes).
    private static func separator(in text: String) -> String.Index? {
        var quote: Character?
        var index = text.startIndex
        while index < text.endIndex {
            let character = text[index]
            if let open = quote {
                if character == open { quote = nil }
            } else if character == "\"" || character == "'" {
                quote = character
            } else if character == ":" {
                let next = text.index(after: index)
                if next == text.endIndex || text[next] == " " { return index }
            }
            index = text.index(after: index)
        }
        return nil
    }

    private static func isPair(_ text: String) -> Bool {
        !text.hasPrefix("[") && !text.hasPrefix("{") && !text.hasPrefix("\"") && !text.hasPrefix("'") && separator(in: text) != nil
    }

    private static func scalar(_ text: String, line: Int) throws -> ManifestYAML {
        if text.hasPrefix("{") { throw Unreadable(line: line, reason: "flow mappings are not supported") }
        if text.hasPrefix("[") {
            guard text.hasSuffix("]") else { throw Unreadable(line: line, reason: "unclosed flow sequence") }
            let inner = text.dropFirst().dropLast().trimmingCharacters(in: .whitespaces)
            if inner.isEmpty { return .list([]) }
            return .list(try inner.split(separator: ",").map { .scalar(try unquote($0.trimmingCharacters(in: .whitespaces), line: line)) })
        }
        return .scalar(try unquote(text, line: line))
    }

    private static func unquote(_ text: String, line: Int) throws -> String {
        for quote in ["\"", "'"] where text.hasPrefix(quote) {
            guard text.count >= 2, text.hasSuffix(quote) else { throw Unreadable(line: line, reason: "unclosed quote: \(text)") }
            return String(text.dropFirst().dropLast())
        }
        return text
    }

    /// The line without a comment (`#` at its start or after a space, outside quotes).
    private static func stripComment(_ line: String) -> String {
        var quote: Character?
        var previous: Character = " "
        for (offset, character) in line.enumerated() {
            if let open = quote {
                if character == open { quote = nil }
            } else if character == "\"" || character == "'" {
                quote = character
            } else if character == "#", previous == " " {
                return String(line.prefix(offset))
            }
            previous = character
        }
        return line
    }
}
