/// The system's random numbers (what `SystemRandomNumberGenerator` gives), as a generator
/// that is not zero-sized: ThreadSanitizer's Swift instrumentation crashes (a SEGV writing
/// its shadow memory) on an `inout` access to a zero-sized value, which
/// `var generator = SystemRandomNumberGenerator(); f(using: &generator)` is. That stopped
/// `scripts/test --sanitize thread`; this type behaves the same without that access.
package struct SystemRandomGenerator: RandomNumberGenerator {
    private var unused: UInt8 = 0

    package init() {}

    package mutating func next() -> UInt64 {
        UInt64.random(in: .min ... .max)
    }
}
