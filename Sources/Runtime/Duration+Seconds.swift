extension Duration {
    /// The duration in seconds, as a floating-point number.
    public var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }

    /// "1.5 s" style rendering for log lines.
    public var formattedSeconds: String {
        if seconds < 1 { return "\(Int((seconds * 1000).rounded())) ms" }
        return "\((seconds * 10).rounded() / 10) s"
    }
}
