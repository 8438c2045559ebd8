import Testing
@testable import XMPP

/// `RecentStrings` gives back what it made for the same bytes, makes anything else afresh,
/// and never hands one string's value out for another's bytes.
@Suite struct RecentStringsTests {
    @Test func theSameBytesGiveTheKeptValueAndOthersAreMadeAfresh() {
        var recent = RecentStrings<String>(capacity: 2, longest: 8)
        var made: [String] = []
        func value(_ text: String) -> String {
            text.withCString { raw in
                recent.value(for: raw) { made.append(String(cString: $0)); return String(cString: $0) }
            }
        }
        #expect(value("a") == "a")
        #expect(value("a") == "a")
        #expect(value("ab") == "ab")
        #expect(value("b") == "b")          // takes the place of "a", the oldest kept
        #expect(value("a") == "a")          // made again, in the place of "ab"
        #expect(value("ab") == "ab" && value("b") == "b")   // both made again, in turn
        #expect(value("toolong-9") == "toolong-9")
        #expect(value("toolong-9") == "toolong-9")
        #expect(made == ["a", "ab", "b", "a", "ab", "b", "toolong-9", "toolong-9"])
        #expect(value("") == "" && value("") == "")
    }
}
