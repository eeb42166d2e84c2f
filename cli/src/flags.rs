//! Value parsers and value enums shared by the subcommands' flags. Each
//! parser's error names the value and what is allowed; clap puts the flag in
//! front (`invalid value '1.5' for '--keep <KEEP>': 1.5 is not in 0..=1`).
//!
//! Sizes are written as people write them: plain bytes (`1073741824`), or a
//! number (a fraction too) with a unit, case-insensitive, a space allowed:
//! `K`, `M`, `G`, `T`, `P`, `E` and `KiB`, `MiB`, ... are powers of 1024
//! (`200M`, `1.5G`, `1536MiB`), `KB`, `MB`, `GB`, ... powers of 1000, as in
//! dd(1). The tool prints sizes back in these units (`1.50 GiB`).

use std::fmt;

use clap::ValueEnum;

/// The eviction policy, as on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Least recently used first (the library's default).
    Lru,
    /// Layer-aware: the expert whose layer the decode loop reaches last first.
    Adaptive,
}

impl PolicyArg {
    /// The library's setting.
    pub fn policy(self) -> smoe::Policy {
        match self {
            PolicyArg::Lru => smoe::Policy::Lru,
            PolicyArg::Adaptive => smoe::Policy::Adaptive,
        }
    }
    /// The name on the command line and in JSON.
    pub fn name(self) -> &'static str {
        policy_name(self.policy())
    }
}

/// A policy's name on the command line and in JSON.
pub fn policy_name(policy: smoe::Policy) -> &'static str {
    match policy {
        smoe::Policy::Lru => "lru",
        smoe::Policy::Adaptive => "adaptive",
    }
}

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

/// A size flag's value: its bytes, and the text as the user wrote it, which
/// is how messages name it (`--mem-cap 200M`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Size {
    /// The size in bytes.
    pub bytes: u64,
    /// What was written on the command line, trimmed.
    pub text: String,
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// What the error of every size flag says is allowed.
const SIZE_FORMS: &str = "bytes, or a number with a unit: 200M, 1.5G, 1536MiB, 2GB";

/// Bytes in `text` ([the module's rules](self)); a unit-less number is
/// `unit` bytes each (1 for a byte flag, 1024 for `--blob-kib`...).
fn bytes_in(text: &str, unit: u64) -> Result<u64, String> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    let b = lower.as_bytes();
    // "KB", "MB", ... (not "KiB", "MiB") are decimal, as in dd(1).
    let decimal = b.len() >= 2
        && b[b.len() - 1] == b'b'
        && matches!(b[b.len() - 2], b'k' | b'm' | b'g' | b't' | b'p' | b'e');
    let config = if decimal {
        parse_size::Config::new().with_decimal()
    } else {
        parse_size::Config::new().with_binary()
    }
    .with_default_factor(unit);
    config.parse_size(t).map_err(|e| match e {
        parse_size::Error::PosOverflow => format!("{text} is more than 2^64 − 1 bytes"),
        _ => format!("{text} is not a size: expected {SIZE_FORMS}"),
    })
}

/// A size in bytes: plain bytes or with a unit ([the module's rules](self)).
pub fn size(text: &str) -> Result<Size, String> {
    Ok(Size {
        bytes: bytes_in(text, 1)?,
        text: text.trim().to_owned(),
    })
}

/// A size of at least one byte.
pub fn positive_size(text: &str) -> Result<Size, String> {
    let s = size(text)?;
    if s.bytes == 0 {
        return Err(format!("{text} is not at least 1 byte"));
    }
    Ok(s)
}

/// A size counted in `unit` bytes (`unit_name`): a plain number is that many
/// units (what the flag has always taken), a size with a unit must be a
/// whole number of them; the count must lie in `least..=most`.
fn size_in_units(
    text: &str,
    unit: u64,
    unit_name: &str,
    least: u64,
    most: u64,
) -> Result<u64, String> {
    let bytes = bytes_in(text, unit)?;
    if bytes % unit != 0 {
        return Err(format!(
            "{text} is {bytes} bytes, not a whole number of {unit_name} ({unit} bytes)"
        ));
    }
    let count = bytes / unit;
    if !(least..=most).contains(&count) {
        return Err(format!("{text} is not in {least}..={most} {unit_name}"));
    }
    Ok(count)
}

/// `--slot-mb`: MiB (a plain number) or a size that is a whole number of
/// MiB, 0..=4294967295 MiB.
pub fn mebibytes(text: &str) -> Result<u32, String> {
    size_in_units(text, 1 << 20, "MiB", 0, u64::from(u32::MAX)).map(|n| n as u32)
}

/// `--blob-kib`: KiB (a plain number) or a size that is a whole number of
/// KiB, 1..=1073741824 KiB (1 KiB to 1 TiB).
pub fn kibibytes(text: &str) -> Result<u64, String> {
    size_in_units(text, 1 << 10, "KiB", 1, 1 << 30)
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

    #[test]
    fn sizes_as_people_write_them() {
        let bytes = |t: &str| size(t).map(|s| s.bytes);
        assert_eq!(bytes("209715200"), Ok(200 << 20));
        assert_eq!(bytes("200M"), Ok(200 << 20));
        assert_eq!(bytes("200m"), Ok(200 << 20));
        assert_eq!(bytes("1.5G"), Ok(3 << 29));
        assert_eq!(bytes("1536MiB"), Ok(1536 << 20));
        assert_eq!(bytes("1536 MiB"), Ok(1536 << 20));
        assert_eq!(bytes("1.50 GiB"), Ok(3 << 29), "what human_bytes prints");
        assert_eq!(bytes("2GB"), Ok(2_000_000_000));
        assert_eq!(bytes("4kB"), Ok(4000));
        assert_eq!(bytes("4k"), Ok(4096));
        assert_eq!(bytes("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(size(" 200M ").unwrap().to_string(), "200M");
        for bad in ["-5", "M", "", "12 parsecs", "0x10"] {
            let e = size(bad).unwrap_err();
            assert!(e.contains(bad) && e.contains("200M"), "{bad}: {e}");
        }
        let e = size("18446744073709551616").unwrap_err();
        assert!(
            e.contains("18446744073709551616") && e.contains("2^64"),
            "{e}"
        );
        assert!(positive_size("0").unwrap_err().contains("at least 1 byte"));
    }

    #[test]
    fn sizes_in_units() {
        assert_eq!(mebibytes("64"), Ok(64));
        assert_eq!(mebibytes("1G"), Ok(1024));
        assert_eq!(mebibytes("4294967295"), Ok(u32::MAX));
        assert!(mebibytes("4294967296")
            .unwrap_err()
            .contains("0..=4294967295"));
        assert!(mebibytes("1.5M")
            .unwrap_err()
            .contains("whole number of MiB"));
        assert!(mebibytes("-1").unwrap_err().contains("-1"));
        assert_eq!(kibibytes("20"), Ok(20));
        assert_eq!(kibibytes("1M"), Ok(1024));
        assert!(kibibytes("0").unwrap_err().contains("1..=1073741824"));
        assert!(kibibytes("1000B")
            .unwrap_err()
            .contains("whole number of KiB"));
    }
}
