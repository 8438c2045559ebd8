import Testing
@testable import XMPP

@Suite struct JSONMemberScannerTests {
    private func scan(_ text: String, pieces: Int = 1) -> [String: String] {
        var scanner = JSONMemberScanner(maximumValueBytes: 32)
        let bytes = Array(text.utf8)
        let size = max(1, bytes.count / pieces)
        var offset = 0
        while offset < bytes.count {
            let end = min(bytes.count, offset + size)
            Array(bytes[offset..<end]).withUnsafeBytes { scanner.feed($0) }
            offset = end
        }
        return scanner.members
    }

    @Test func topLevelStringsAreReadAndEverythingNestedIsPassedOver() {
        let text = #"{"a": "1", "n": 2, "o": {"a": "inner", "b": ["x", {"c": "d"}]}, "t": true, "s": "q\"uote\\ \u00e9 \ud83d\ude00", "z":"last"}"#
        for pieces in [1, 3, 17, text.utf8.count] {
            #expect(scan(text, pieces: pieces) == ["a": "1", "s": "q\"uote\\ é 😀", "z": "last"], "\(pieces) pieces")
        }
    }

    @Test func tooLongValuesAndNonJSONYieldNothingForThem() {
        #expect(scan(#"{"long": "\#(String(repeating: "v", count: 40))", "ok": "yes"}"#) == ["ok": "yes"])
        #expect(scan("not json at all").isEmpty)
        #expect(scan(#"["a", "b"]"#).isEmpty)
        #expect(scan(#"{"a": "first", "a": "second"}"#) == ["a": "first"])
    }
}
