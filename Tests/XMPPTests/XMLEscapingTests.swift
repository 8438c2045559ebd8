import Testing
@testable import XMPP

/// The word-at-a-time scan of element text agrees with the byte rule everywhere: every byte
/// value, at every position of a word and of the tail after the last whole word.
@Suite struct XMLEscapingTests {
    /// The byte rule for element content, written out here independently of the code.
    private func needsEscapeInText(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "&"), UInt8(ascii: "<"), UInt8(ascii: ">"), UInt8(ascii: "\r"), 0xEF: true
        case UInt8(ascii: "\n"), UInt8(ascii: "\t"): false
        default: byte < 0x20
        }
    }

    @Test func everyByteAtEveryPositionIsFoundOrPassedAsTheByteRuleSays() {
        for length in [1, 7, 8, 9, 16, 19, 24] {
            for position in 0..<length {
                for value in 0...255 {
                    var bytes = [UInt8](repeating: UInt8(ascii: "a"), count: length)
                    bytes[position] = UInt8(value)
                    let plain = bytes.withUnsafeBufferPointer { XMLEscaping.isPlainText($0) }
                    #expect(plain == !needsEscapeInText(UInt8(value)), "byte \(value) at \(position) of \(length)")
                }
            }
        }
    }

    @Test func typicalJSONIsPlainAndItsEscapesAreWritten() {
        let json = #"{"message_id":"ds-1234","to":"token-0123456789","data":{"k":"v","n":"1.5"},"time_to_live":0}"#
        #expect(XMLEscaping.escapeText(json) == json)
        #expect(XMLEscaping.escapeText(json + "<&>\r") == json + "&lt;&amp;&gt;&#13;")
        #expect(XMLEscaping.escapeText("\u{FFFE}" + json) == "\u{FFFD}" + json)
        #expect(XMLEscaping.escapeText(json + "é\u{F000}\n\t") == json + "é\u{F000}\n\t")
    }
}
