//! How the tool writes: results to stdout, problems to stderr as
//! `smoe: <message>` lines, and a closed pipe (`smoe inspect | head`) ends
//! the program quietly instead of panicking the way `println!` would.

use std::io::{self, Write};

use smoe::internals::printable::escape;

/// Why a command failed.
#[derive(Debug)]
pub enum Failure {
    /// Print `smoe: <message>` on stderr, exit 1.
    Message(String),
    /// A usage error found after parsing: clap reports it, exit 2.
    Usage(String),
    /// stdout was closed by the reader; exit 0 without another word.
    BrokenPipe,
    /// The problems were already printed (one stderr line each): exit 1.
    Reported,
}

impl From<smoe::Error> for Failure {
    fn from(e: smoe::Error) -> Self {
        Failure::Message(e.message())
    }
}

/// Writes `text` to stdout.
pub fn out(text: &str) -> Result<(), Failure> {
    let mut stdout = io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| match e.kind() {
            io::ErrorKind::BrokenPipe => Failure::BrokenPipe,
            _ => Failure::Message(format!("cannot write to stdout: {e}")),
        })
}

/// Writes `smoe: <message>` on stderr as exactly one line: every control
/// character of it (a newline, an ESC from a name in a file) escaped, as
/// the library escapes its errors (`\x0a`, `\x1b`).
pub fn error_line(message: &str) {
    let one_line = escape(message);
    // Nothing useful can be done if stderr itself is gone.
    let _ = writeln!(io::stderr().lock(), "smoe: {one_line}");
}

/// Writes `smoe: warning: <message>` on stderr as exactly one line: what a
/// run that goes on wants the user to know (a streamer's open-time
/// warnings).
pub fn warning_line(message: &str) {
    error_line(&format!("warning: {message}"));
}

/// Bytes in binary units, e.g. "1.50 GiB" (or "512 B").
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

/// Throughput in decimal gigabytes per second (10^9 bytes/s), as disks are rated.
pub fn gb_per_s(bytes: u64, seconds: f64) -> String {
    if seconds <= 0.0 {
        return "n/a GB/s".to_owned();
    }
    format!("{:.2} GB/s", bytes as f64 / seconds / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(1 << 30), "1.00 GiB");
        assert_eq!(gb_per_s(2_000_000_000, 1.0), "2.00 GB/s");
    }
}
