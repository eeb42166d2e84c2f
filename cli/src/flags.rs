//! Value parsers for the numeric flags clap has no ready range for. Each
//! error names the value and the range; clap puts the flag in front
//! (`invalid value '1.5' for '--keep <KEEP>': 1.5 is not in 0..=1`).

/// A probability: a number in 0..=1 (not NaN).
pub fn probability(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("{text} is not in 0..=1")),
    }
}

/// Any u64, with the range in the error (a minus sign, a fraction or a
/// number past 2^64 − 1).
pub fn whole_u64(text: &str) -> Result<u64, String> {
    text.parse::<u64>()
        .map_err(|_| format!("{text} is not a whole number in 0..={}", u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(probability("0"), Ok(0.0));
        assert_eq!(probability("1"), Ok(1.0));
        assert_eq!(probability("0.45"), Ok(0.45));
        for bad in ["-0.1", "1.0001", "NaN", "inf", "x", ""] {
            assert!(probability(bad).unwrap_err().contains("0..=1"), "{bad}");
        }
        assert_eq!(whole_u64("18446744073709551615"), Ok(u64::MAX));
        for bad in ["-1", "18446744073709551616", "1.5"] {
            assert!(whole_u64(bad).unwrap_err().contains(bad), "{bad}");
        }
    }
}
