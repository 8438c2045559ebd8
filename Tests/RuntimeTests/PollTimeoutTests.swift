import Testing
@testable import Runtime

/// `Duration.pollMilliseconds`, the one conversion every poll(2) loop uses: a wait is never
/// cut short (rounded up), a past deadline polls without waiting, and a far one stays in range.
@Suite struct PollTimeoutTests {
    @Test func roundsUpNeverBelowZeroAndAtMostADay() {
        #expect(Duration.milliseconds(5).pollMilliseconds == 5)
        #expect(Duration.microseconds(1).pollMilliseconds == 1)
        #expect(Duration.nanoseconds(1_000_001).pollMilliseconds == 2)
        #expect(Duration.zero.pollMilliseconds == 0)
        #expect(Duration.milliseconds(-3).pollMilliseconds == 0)
        #expect(Duration.seconds(90_000).pollMilliseconds == 86_400_000)
    }
}
