#if canImport(Glibc)
import Glibc
#endif

extension String {
    /// True when the text holds U+0000, which PostgreSQL's text cannot hold: a `memchr` over
    /// its UTF-8 bytes (`utf8.contains(0)` walks them one index at a time, a few percent of
    /// the worker's CPU per upstream message, which checks each id and token).
    package var holdsNUL: Bool {
        let found = utf8.withContiguousStorageIfAvailable { bytes in
            guard let start = bytes.baseAddress, bytes.count > 0 else { return false }
            return memchr(start, 0, bytes.count) != nil
        }
        return found ?? utf8.contains(0)
    }
}
