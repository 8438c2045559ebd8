@testable import Runtime
import Testing

@Suite struct CRC32Tests {
    /// The one-byte-at-a-time definition, to check the sliced one against.
    private func reference(_ bytes: [UInt8]) -> UInt32 {
        var crc: UInt32 = 0xFFFF_FFFF
        for byte in bytes {
            crc ^= UInt32(byte)
            for _ in 0..<8 { crc = crc & 1 != 0 ? 0xEDB8_8320 ^ (crc >> 1) : crc >> 1 }
        }
        return crc ^ 0xFFFF_FFFF
    }

    @Test func matchesTheStandardCheckValue() {
        #expect(CRC32.checksum(Array("123456789".utf8)) == 0xCBF4_3926)
        #expect(CRC32.checksum([UInt8]()) == 0)
    }

    @Test func slicingByEightAgreesWithTheDefinitionAtEveryLengthAndAlignment() {
        var generator = SystemRandomGenerator()
        let bytes = (0..<300).map { _ in UInt8.random(in: 0...255, using: &generator) }
        for start in 0..<9 {
            for end in stride(from: start, through: bytes.count, by: 7) {
                let slice = Array(bytes[start..<end])
                #expect(CRC32.checksum(slice) == reference(slice))
                // A sequence without contiguous storage takes the copying path.
                #expect(CRC32.checksum(slice.lazy.map { $0 }) == reference(slice))
            }
        }
    }
}
