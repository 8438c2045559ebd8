import Testing
@testable import Ingress

/// The verified-token cache's key compares tokens as bytes: a token that only looks like a
/// verified one (canonically equivalent text) is checked afresh, never taken from the cache.
@Suite struct TokenKeyTests {
    @Test func canonicallyEquivalentTokensAreDifferentKeys() {
        let verified = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJLIn0.K-signature"
        // U+212A KELVIN SIGN is canonically equivalent to K: Swift's String == says equal.
        let lookalike = verified.replacingOccurrences(of: "K", with: "\u{212A}")
        #expect(verified == lookalike, "the strings compare equal as Swift strings")
        #expect(TokenKey(verified) != TokenKey(lookalike))
        #expect(TokenKey(verified) == TokenKey(String(verified)))
        #expect(TokenKey("") == TokenKey(""))
        #expect(TokenKey("a") != TokenKey(""))
    }
}
