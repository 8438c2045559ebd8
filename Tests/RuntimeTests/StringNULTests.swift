import Testing
@testable import Runtime

/// `holdsNUL` finds U+0000 wherever it is, in native and in small strings.
@Suite struct StringNULTests {
    @Test func findsUPlus0000AnywhereAndNothingElse() {
        for text in ["\u{0}", "a\u{0}", "\u{0}b", String(repeating: "x", count: 300) + "\u{0}" + "y", "héllo\u{0}😀"] {
            #expect(text.holdsNUL, "\(text.debugDescription)")
        }
        for text in ["", "a", "0", "\\u0000", String(repeating: "long text ", count: 100), "héllo 😀"] {
            #expect(!text.holdsNUL, "\(text.debugDescription)")
        }
        // A substring's copy and a string built by appending are checked the same way.
        var built = "prefix-"
        built += "\u{0}"
        #expect(built.holdsNUL)
        #expect(!String("abc\u{0}def".prefix(3)).holdsNUL)
    }
}
