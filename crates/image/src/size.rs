//! Sizes as users write them (`64M`, `1G`, `4096`), with the same meaning as the guest
//! agent's `rebound.memfill=SIZE` parser (binary units, optional `iB`/`B`, at most 1 TiB),
//! so a host can refuse a bad value before the guest sees it.

/// Errors parsing a size.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SizeError {
    #[error("size {0:?} is empty")]
    Empty(String),
    #[error("size {0:?} is not a number with an optional K, M or G suffix")]
    Syntax(String),
    #[error("size {0:?} is larger than 1 TiB")]
    TooLarge(String),
}

const MAX: u64 = 1 << 40;

/// Parses `N`, `NK`, `NM`, `NG` (also `NKiB`, `NMB`, ...) into bytes.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    if s.is_empty() {
        return Err(SizeError::Empty(s.to_string()));
    }
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(SizeError::Syntax(s.to_string()));
    }
    let (num, unit) = s.split_at(digits);
    let mul: u64 = match unit.to_ascii_lowercase().as_str() {
        "" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(SizeError::Syntax(s.to_string())),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| SizeError::TooLarge(s.to_string()))?;
    match n.checked_mul(mul) {
        Some(v) if v <= MAX => Ok(v),
        _ => Err(SizeError::TooLarge(s.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("2MiB"), Ok(2 << 20));
        assert_eq!(parse_size("2MB"), Ok(2 << 20));
        assert_eq!(parse_size("1024G"), Ok(1 << 40));
    }

    #[test]
    fn malformed() {
        assert!(matches!(parse_size(""), Err(SizeError::Empty(_))));
        for bad in [
            "M", "-1M", "1.5G", "64 M", "64MM", "64T", "0x10", " 64M", "64Mi", "1e3",
        ] {
            assert!(
                matches!(parse_size(bad), Err(SizeError::Syntax(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn oversized() {
        assert!(matches!(parse_size("1025G"), Err(SizeError::TooLarge(_))));
        assert!(matches!(
            parse_size("99999999999999999999999"),
            Err(SizeError::TooLarge(_))
        ));
        assert!(matches!(
            parse_size("18446744073709551615G"),
            Err(SizeError::TooLarge(_))
        ));
    }
}
