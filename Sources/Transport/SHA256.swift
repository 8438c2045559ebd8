internal import COpenSSL

/// SHA-256 through OpenSSL.
public enum SHA256 {
    /// The digest of `bytes`, as 64 lowercase hex digits.
    public static func hex(_ bytes: [UInt8]) -> String {
        hex(bytes, digits: 64)
    }

    /// The first `digits` (at most 64) lowercase hex digits of the digest of `text`'s UTF-8.
    public static func hex(of text: String, digits count: Int) -> String {
        var text = text
        return text.withUTF8 { hex(UnsafeRawBufferPointer($0), digits: count) }
    }

    private static func hex(_ bytes: [UInt8], digits count: Int) -> String {
        bytes.withUnsafeBytes { hex($0, digits: count) }
    }

    private static func hex(_ input: UnsafeRawBufferPointer, digits count: Int) -> String {
        TLSContext.initializeForProcess()
        var digest = (UInt64(0), UInt64(0), UInt64(0), UInt64(0))
        var length: UInt32 = 0
        let done = withUnsafeMutableBytes(of: &digest) { output in
            EVP_Digest(input.baseAddress, input.count, output.baseAddress?.assumingMemoryBound(to: UInt8.self), &length, EVP_sha256(), nil)
        }
        precondition(done == 1 && length == 32, "OpenSSL's SHA-256 failed")
        let count = min(max(count, 0), 64)
        return withUnsafeBytes(of: &digest) { digest in
            String(unsafeUninitializedCapacity: count) { text in
                let digits: StaticString = "0123456789abcdef"
                let table = digits.utf8Start
                for index in 0..<count {
                    let byte = digest[index / 2]
                    text[index] = table[Int(index % 2 == 0 ? byte >> 4 : byte & 0x0F)]
                }
                return count
            }
        }
    }

}
