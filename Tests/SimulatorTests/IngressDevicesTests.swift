@testable import Simulator
import Testing

/// How the simulated devices (`Posting`) read the ingress's answers.
@Suite struct IngressDevicesTests {
    @Test func theStatusesOfAnAnswerAreReadInOrder() {
        #expect(Posting.statuses(of: #"{"message_id":"m-1","status":"accepted"}"#) == ["accepted"])
        #expect(Posting.statuses(of: #"{"results":[{"message_id":"a","status":"accepted"},{"message_id":"b","status":"duplicate"},"#
                                        + #"{"message_id":"?","status":"invalid","error":"data: not an object"}]}"#)
                == ["accepted", "duplicate", "invalid"])
        // A message id that looks like a member is inside a string: only real members count.
        #expect(Posting.statuses(of: #"{"message_id":"status","status":"accepted"}"#) == ["accepted"])
        #expect(Posting.statuses(of: #"{"error":{"code":503,"status":"overloaded"}}"#) == ["overloaded"])
        #expect(Posting.statuses(of: "").isEmpty)
        #expect(Posting.statuses(of: #"{"status":"unterminated"#).isEmpty)
    }
}
