#if canImport(Glibc)
import Glibc
#endif

/// The last few strings made from C strings, given back when the same bytes come again.
///
/// A stream repeats a handful of element names, namespaces and attribute values on every
/// stanza (`jabber:client\u{1}message`, `google:mobile:data\u{1}gcm`,
/// `devices@gcm.googleapis.com`); making each of them a `String` again (a `strlen`, an
/// allocation past 15 bytes, a UTF-8 check) was a visible part of the parser's cost per
/// stanza. A lookup is a `strlen` and at most `capacity` `memcmp`s; strings that do not
/// repeat cost a copy of their bytes and push out the oldest entry. Not thread-safe: it
/// belongs to one parser.
struct RecentStrings<Value> {
    private struct Entry {
        let bytes: [UInt8]
        let value: Value
    }

    private let capacity: Int
    private let longest: Int
    private var entries: [Entry] = []
    private var next = 0

    /// - Parameters:
    ///   - capacity: how many strings are kept.
    ///   - longest: strings longer than this many bytes are made afresh, never kept.
    init(capacity: Int = 8, longest: Int = 128) {
        self.capacity = capacity
        self.longest = longest
        entries.reserveCapacity(capacity)
    }

    /// The value made of `raw` last time, or `make(raw)` (kept for next time).
    mutating func value(for raw: UnsafePointer<CChar>, make: (UnsafePointer<CChar>) -> Value) -> Value {
        let length = strlen(raw)
        guard length <= longest else { return make(raw) }
        for entry in entries where entry.bytes.count == length {
            if entry.bytes.withUnsafeBytes({ memcmp($0.baseAddress!, raw, length) == 0 }) { return entry.value }
        }
        let value = make(raw)
        let entry = Entry(bytes: Array(UnsafeRawBufferPointer(start: raw, count: length)), value: value)
        if entries.count < capacity {
            entries.append(entry)
        } else {
            entries[next] = entry
            next = (next + 1) % capacity
        }
        return value
    }
}
