import Testing
@testable import Ingress

/// What a device's body may be: UTF-8 as sent (never repaired), no member named twice, and
/// no more queued for `data` than its 4 KB limit needs, however the body is padded.
@Suite struct IngressMessageTests {
    private static func parse(_ bytes: [UInt8]) -> Result<IngressMessage, IngressMessage.Invalid> {
        do {
            let results = try IngressMessage.parse(body: bytes, batch: false)
            return results[0]
        } catch {
            return .failure(error)
        }
    }

    private static func parse(_ text: String) -> Result<IngressMessage, IngressMessage.Invalid> { parse(Array(text.utf8)) }

    @Test func invalidUTF8IsRefusedNeverRepaired() {
        // b-\xff and b-\xfe would both become b-\u{FFFD}: two ids, one stored.
        for byte: UInt8 in [0xFF, 0xFE] {
            let body = Array(#"{"message_id":"b-"#.utf8) + [byte] + Array(#"","data":{}}"#.utf8)
            guard case .failure(let invalid) = Self.parse(body) else {
                Issue.record("a body with byte \(byte) was read")
                continue
            }
            #expect(invalid.description.contains("UTF-8"))
        }
        var batch = Array(#"{"messages":[{"message_id":"ok","data":{}},{"message_id":"x"#.utf8)
        batch += [0xC3] + Array(#"","data":{}}]}"#.utf8)
        #expect(throws: IngressMessage.Invalid.self) { try IngressMessage.parse(body: batch, batch: true) }
    }

    @Test func aMemberNamedTwiceIsRefused() {
        let repeatedKeys = #"{"message_id":"r","data":{"a":"1","a":"2"}}"#
        #expect(throws: Never.self) { _ = try Self.parse(#"{"message_id":"r","data":{"a":"1","b":"2"}}"#).get() }
        guard case .failure(let invalid) = Self.parse(repeatedKeys) else { Issue.record("read"); return }
        #expect(invalid.description.contains("named twice"), "\(invalid)")
        guard case .failure = Self.parse(#"{"message_id":"r","message_id":"s","data":{}}"#) else { Issue.record("two ids read"); return }
        guard case .failure = Self.parse(#"{"message_id":"r","token":"a","token":"b","data":{}}"#) else { Issue.record("two tokens read"); return }
        // 880 repeats of one key: each within the limit, together refused.
        let many = (0..<880).map { _ in #""k":"v""# }.joined(separator: ",")
        guard case .failure = Self.parse(#"{"message_id":"m","data":{\#(many)}}"#) else { Issue.record("880 repeats read"); return }
    }

    @Test func paddedDataIsNotQueuedAsSent() throws {
        let padding = String(repeating: " ", count: 900_000)
        let message = try Self.parse(#"{"message_id":"p","data":{"a":\#(padding)"b"}}"#).get()
        #expect(message.data == ["a": "b"])
        #expect(message.dataJSON.utf8.count <= 2 * IngressMessage.maximumDataBytes, "\(message.dataJSON.utf8.count) bytes kept")
        // An ordinary body keeps data exactly as sent.
        let plain = try Self.parse(#"{"message_id":"q","data":{"a": "b"}}"#).get()
        #expect(plain.dataJSON == #"{"a": "b"}"#)
    }
}
