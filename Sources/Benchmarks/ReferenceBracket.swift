import Foundation

/// What a measured run is compared with: the same reference work (stored upstream messages)
/// measured right before the run and right after it.
///
/// These machines' speed drifts by up to 10 % within a minute, and the worker's and
/// PostgreSQL's figures drift together. A reference taken before the run alone charges all
/// drift during the run to the run's ratio. The mean of the references on both sides of it
/// cancels a steady drift, and the two values show how far the machine moved meanwhile.
package struct ReferenceBracket: Sendable, Equatable {
    /// One reference's cost per unit of work, in µs: the worker's, and PostgreSQL's when
    /// it was measured (a local cluster).
    package struct Cost: Sendable, Equatable {
        package var worker: Double
        package var postgres: Double?

        package init(worker: Double, postgres: Double?) {
            self.worker = worker
            self.postgres = postgres
        }
    }

    package let before: Cost
    package let after: Cost

    package init(before: Cost, after: Cost) {
        self.before = before
        self.after = after
    }

    /// The mean of the two references; PostgreSQL's only when both measured it.
    package var mean: Cost {
        Cost(worker: (before.worker + after.worker) / 2,
             postgres: before.postgres.flatMap { first in after.postgres.map { (first + $0) / 2 } })
    }

    /// How the references moved across the run, e.g. `worker 17.4 → 17.9 µs, PostgreSQL
    /// 16.0 → 16.8 µs`.
    package var drift: String {
        var text = "worker \(Self.format(before.worker)) → \(Self.format(after.worker)) µs"
        if let first = before.postgres, let second = after.postgres {
            text += ", PostgreSQL \(Self.format(first)) → \(Self.format(second)) µs"
        }
        return text
    }

    /// One decimal, as the benchmark prints CPU figures.
    private static func format(_ micros: Double) -> String { String(format: "%.1f", micros) }
}
