//! Formatting helpers shared by the benchmarks.

/// `a / b`, or 0 when `b` is 0.
pub fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        0.0
    } else {
        a / b
    }
}

/// A PASS/FAIL line.
pub fn verdict(ok: bool, what: &str) -> String {
    format!("{} {what}", if ok { "PASS" } else { "FAIL" })
}
