import Benchmarks
import Testing

/// The downstream benchmark's ratios are taken against the mean of the references measured
/// on both sides of a run, which cancels a steady drift of the machine's speed.
@Suite struct ReferenceBracketTests {
    @Test func aSteadyDriftDuringTheRunIsCancelled() {
        // The machine slows 5 % a step: reference, run, reference. A run costing 1.4 times
        // a stored message at its own time is 1.4x the mean, not 1.47x the first reference.
        let speed = { (step: Double) in 1 + 0.05 * step }
        let bracket = ReferenceBracket(before: .init(worker: 17 * speed(0), postgres: 16 * speed(0)),
                                       after: .init(worker: 17 * speed(2), postgres: 16 * speed(2)))
        let run = 1.4 * 17 * speed(1)
        #expect(abs(run / bracket.mean.worker - 1.4) < 1e-12)
        #expect(abs(bracket.mean.postgres! - 16 * speed(1)) < 1e-12)
        #expect(run / bracket.before.worker > 1.46)
        #expect(bracket.drift == "worker 17.0 → 18.7 µs, PostgreSQL 16.0 → 17.6 µs")
    }

    @Test func postgreSQLsMeanNeedsBothReferences() {
        let measured = ReferenceBracket.Cost(worker: 10, postgres: 8)
        let unmeasured = ReferenceBracket.Cost(worker: 12, postgres: nil)
        for bracket in [ReferenceBracket(before: measured, after: unmeasured), ReferenceBracket(before: unmeasured, after: measured)] {
            #expect(bracket.mean == ReferenceBracket.Cost(worker: 11, postgres: nil))
            #expect(bracket.drift == (bracket.before == measured ? "worker 10.0 → 12.0 µs" : "worker 12.0 → 10.0 µs"))
        }
    }
}
