extension Duration {
    /// This duration as a poll(2) timeout: milliseconds rounded up, at least 0, at most a day.
    package var pollMilliseconds: Int32 {
        if self <= .zero { return 0 }
        let (seconds, attoseconds) = components
        let milliseconds = seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
        return Int32(min(milliseconds, 86_400_000))
    }
}
