/// SplitMix64 from a fixed seed: varied draws (a constant one would make a floating-point
/// draw from a half-open range retry forever), the same in every run, so that a failing
/// run can be repeated.
struct SplitMix: RandomNumberGenerator {
    var state: UInt64

    init(seed: UInt64 = 0x9E37_79B9_7F4A_7C15) {
        state = seed
    }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
