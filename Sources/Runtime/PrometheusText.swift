/// Builds a page in the Prometheus text exposition format (version 0.0.4): each family
/// once, with `# HELP` and `# TYPE`, label values escaped.
package struct PrometheusText {
    package init() {}

    package typealias Labels = [(String, String)]
    package private(set) var text = ""

    package mutating func counter(_ name: String, _ help: String, _ samples: [(Labels, Double)]) {
        family(name, help, "counter", samples)
    }

    package mutating func counter(_ name: String, _ help: String, _ value: Int) {
        family(name, help, "counter", [([], Double(value))])
    }

    package mutating func gauge(_ name: String, _ help: String, _ samples: [(Labels, Double)]) {
        family(name, help, "gauge", samples)
    }

    package mutating func gauge(_ name: String, _ help: String, _ value: Double) {
        family(name, help, "gauge", [([], value)])
    }

    package mutating func histogram(_ name: String, _ help: String, _ series: [(Labels, Histogram)]) {
        text += "# HELP \(name) \(help)\n# TYPE \(name) histogram\n"
        for (labels, histogram) in series {
            let cumulative = histogram.cumulativeCounts
            for (index, bound) in histogram.bounds.enumerated() {
                line("\(name)_bucket", labels + [("le", Self.number(bound))], Double(cumulative[index]))
            }
            line("\(name)_bucket", labels + [("le", "+Inf")], Double(histogram.count))
            line("\(name)_sum", labels, histogram.sum)
            line("\(name)_count", labels, Double(histogram.count))
        }
    }

    private mutating func family(_ name: String, _ help: String, _ type: String, _ samples: [(Labels, Double)]) {
        text += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
        for (labels, value) in samples { line(name, labels, value) }
    }

    private mutating func line(_ name: String, _ labels: Labels, _ value: Double) {
        text += name
        if !labels.isEmpty {
            text += "{" + labels.map { "\($0.0)=\"\(Self.escape($0.1))\"" }.joined(separator: ",") + "}"
        }
        text += " " + Self.number(value) + "\n"
    }

    package static func number(_ value: Double) -> String {
        if value.isNaN { return "NaN" }
        if value.isInfinite { return value > 0 ? "+Inf" : "-Inf" }
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        return "\(value)"
    }

    package static func escape(_ value: String) -> String {
        var escaped = ""
        for character in value {
            switch character {
            case "\\": escaped += "\\\\"
            case "\"": escaped += "\\\""
            case "\n": escaped += "\\n"
            default: escaped.append(character)
            }
        }
        return escaped
    }
}
