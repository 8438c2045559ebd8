import Runtime
import Testing

/// `firstOffset(ofBytes:from:)`, the scan the quick body reads use.
@Suite struct ByteSearchTests {
    private func offset(of needle: String, in text: String, from start: Int = 0) -> Int? {
        Array(text.utf8).withUnsafeBufferPointer { $0.firstOffset(ofBytes: Array(needle.utf8), from: start) }
    }

    @Test func findsTheFirstOccurrenceAtOrAfterTheStart() {
        #expect(offset(of: #""token""#, in: #"{"message_id":"a","token":"t"}"#) == 18)
        #expect(offset(of: "ab", in: "xxabab") == 2)
        #expect(offset(of: "ab", in: "xxabab", from: 3) == 4)
        #expect(offset(of: "ab", in: "ab") == 0, "the whole buffer")
        #expect(offset(of: "b", in: "ab") == 1, "at the last offset")
        #expect(offset(of: "aab", in: "aaab") == 1, "after a partial match")
    }

    @Test func findsNothingWhereItIsNot() {
        #expect(offset(of: "abc", in: "ab") == nil, "longer than the buffer")
        #expect(offset(of: "ba", in: "abab", from: 3) == nil)
        #expect(offset(of: "", in: "abc") == nil, "an empty needle")
        #expect(offset(of: "a", in: "") == nil)
        #expect(offset(of: "a", in: "abc", from: 5) == nil, "a start past the end")
    }
}
