internal import COpenSSL

/// SHA-256 through OpenSSL.
public enum SHA256 {
    /// The digest of `bytes`, as 64 lowercase hex digits.
    public static func hex(_ bytes: [UInt8]) -> String {
        TLSContext.initializeForProcess()
        var digest = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let done = bytes.withUnsafeBytes { input in
            digest.withUnsafeMutableBytes { output in
                EVP_Digest(input.baseAddress, input.count, output.baseAddress?.assumingMemoryBound(to: UInt8.self), &length,
                           EVP_sha256(), nil)
            }
        }
        precondition(done == 1 && length == 32, "OpenSSL's SHA-256 failed")
        let digits = Array("0123456789abcdef".utf8)
        var text: [UInt8] = []
        text.reserveCapacity(64)
        for byte in digest {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: text, as: UTF8.self)
    }
}
