import Foundation
@testable import Runtime
import Testing

@Suite struct ThreadPriorityTests {
    @Test func aThreadCanLowerItsOwnPriorityWithoutTouchingOtherThreads() async {
        let before = getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0)
        let seen = await withCheckedContinuation { (continuation: CheckedContinuation<Int32, Never>) in
            let thread = Thread {
                let raised = ThreadPriority.setCurrentThread(niceness: 7)
                continuation.resume(returning: raised ? getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0) : -100)
            }
            thread.start()
        }
        #expect(seen == 7)
        #expect(getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0) == before)
    }
}
