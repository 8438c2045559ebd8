extension UnsafeBufferPointer where Element == UInt8 {
    /// Where `needle` first occurs in these bytes at or after offset `start`, or nil (an
    /// empty needle occurs nowhere). A plain scan, for the short needles of a body read
    /// without a parse (a member's quoted name).
    package func firstOffset(ofBytes needle: [UInt8], from start: Int = 0) -> Int? {
        guard let first = needle.first, start >= 0, count >= needle.count else { return nil }
        let last = count - needle.count
        var offset = start
        while offset <= last {
            if self[offset] == first && UnsafeBufferPointer(rebasing: self[offset..<(offset + needle.count)]).elementsEqual(needle) {
                return offset
            }
            offset += 1
        }
        return nil
    }
}
