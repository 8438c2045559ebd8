import Foundation
@testable import Postgres
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The timestamp text a COPY row and a parameter carry, against the C library's calendar.
@Suite struct PostgresTimestampTests {
    /// What `gmtime_r` makes of the second of `date` (rounded to the microsecond), as text.
    private static func reference(_ date: Date) -> String {
        let microseconds = (date.timeIntervalSince1970 * 1_000_000).rounded()
        let seconds = Int64((microseconds / 1_000_000).rounded(.down))
        let fraction = Int64(microseconds) - seconds * 1_000_000
        var time = time_t(seconds)
        var parts = tm()
        gmtime_r(&time, &parts)
        return String(format: "%04d-%02d-%02d %02d:%02d:%02d.%06lld+00", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1,
                      Int(parts.tm_mday), Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec), fraction)
    }

    @Test func daysFrom1900To2400AndTheirEdgesMatchTheCLibrary() {
        // Every fifth day's first and last microsecond, and one inside it (the stride is
        // prime to the years' and months' lengths, so every date of the calendar comes up),
        // across leap years and centuries.
        let first = Int64(-2_208_988_800)  // 1900-01-01
        var mismatches: [String] = []
        for day in stride(from: Int64(0), to: 182_622, by: 5) {
            let midnight = first + day * 86_400
            for offset in [0.0, 43_210.123_456, 86_399.999_999] {
                let date = Date(timeIntervalSince1970: Double(midnight) + offset)
                let made = PostgresTimestamp.format(date), expected = Self.reference(date)
                if made != expected { mismatches.append("\(made) instead of \(expected)") }
            }
        }
        #expect(mismatches.isEmpty, "\(mismatches.prefix(5))")
    }

    @Test func aCopyRowCarriesTheSameText() {
        let date = Date(timeIntervalSince1970: 1_709_164_800.5)  // 2024-02-29 00:00:00.5
        var row: [UInt8] = []
        PostgresCopyText.append(row: [.timestamptz(date), .text("x")], to: &row)
        #expect(String(decoding: row, as: UTF8.self) == "2024-02-29 00:00:00.500000+00\tx\n")
        #expect(PostgresTimestamp.format(date) == "2024-02-29 00:00:00.500000+00")
        #expect(PostgresTimestamp.parse(PostgresTimestamp.format(date)) == date)
    }
}
