import Testing
@testable import Outbox

/// The sliding count the wrong-project rule rests on, as a pure value.
@Suite struct CountWindowTests {
    let start = ContinuousClock.now

    @Test func whatFellOutOfTheWindowIsForgottenToWithinABucket() {
        var window = CountWindow(window: .seconds(60), now: start)
        for second in 0..<30 { window.add(at: start + .seconds(second)) }
        #expect(window.total(at: start + .seconds(30)) == 30)
        // Seventy seconds in, the first ten seconds' counts have left the window (to a bucket).
        let later = window.total(at: start + .seconds(70))
        #expect((19...21).contains(later), "\(later)")
        #expect(window.total(at: start + .seconds(200)) == 0)
        window.add(at: start + .seconds(200))
        window.reset(at: start + .seconds(201))
        #expect(window.total(at: start + .seconds(201)) == 0)
    }
}
