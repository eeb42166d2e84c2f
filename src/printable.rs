//! Text from files made safe to print: the one home of escaping. Names
//! from a model (tensor names, its architecture, file names) and paths
//! reach error lines, `smoe_last_error()`, the streamer's warnings and the
//! tool's output; a byte a terminal acts on (ESC starting a sequence, BEL,
//! a newline forging a line of output) must arrive as text that says what
//! it was, never as itself.
//!
//! What passes: printable ASCII, and valid Unicode that is neither a
//! control nor a character that reorders or breaks lines. What is escaped:
//!
//! - C0 controls (U+0000 to U+001F, newline and tab among them) and DEL
//!   as `\xNN`;
//! - C1 controls (U+0080 to U+009F; a terminal may take U+009B for CSI),
//!   the line and paragraph separators and the bidirectional controls
//!   (which reorder what follows them on the screen) as `\u{NN}`;
//! - bytes that are not UTF-8 (only a path can hold them) as `\xNN`.
//!
//! A backslash is not escaped: text that already reads `\x1b` is
//! harmless, and paths stay readable. Escaping is idempotent (its output is
//! printable ASCII wherever it changed anything).
//!
//! This module imports nothing of the crate, so every other one may use
//! it.

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::path::Path;

/// Whether `c` is shown as an escape rather than as itself.
fn escaped(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{61c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// Writes `c`, escaped if it must be.
fn write_char(out: &mut dyn fmt::Write, c: char) -> fmt::Result {
    if !escaped(c) {
        return out.write_char(c);
    }
    match u32::from(c) {
        n @ (0..=0x1f | 0x7f) => write!(out, "\\x{n:02x}"),
        n => write!(out, "\\u{{{n:x}}}"),
    }
}

/// Writes `s` with every character that must be escaped escaped.
fn write_str(out: &mut dyn fmt::Write, s: &str) -> fmt::Result {
    let mut rest = s;
    while let Some(at) = rest.find(escaped) {
        out.write_str(&rest[..at])?;
        let c = rest[at..].chars().next().unwrap_or_default();
        write_char(out, c)?;
        rest = &rest[at + c.len_utf8()..];
    }
    out.write_str(rest)
}

/// Writes `bytes` (a path's, say): the UTF-8 in it as [`write_str`]
/// writes it, every byte that is not UTF-8 as `\xNN`.
fn write_bytes(out: &mut dyn fmt::Write, bytes: &[u8]) -> fmt::Result {
    for chunk in bytes.utf8_chunks() {
        write_str(out, chunk.valid())?;
        for b in chunk.invalid() {
            write!(out, "\\x{b:02x}")?;
        }
    }
    Ok(())
}

/// `s`, escaped: borrowed when nothing in it needs escaping.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.contains(escaped) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    // Writing to a String cannot fail.
    let _ = write_str(&mut out, s);
    Cow::Owned(out)
}

/// JSON text whose writer escaped only what JSON requires (the controls
/// below U+0020), with every other character [`escape`] would escape
/// (DEL, the C1 controls, the separators and bidirectional controls)
/// written as a JSON `\uXXXX` escape: the same value to a JSON reader, no
/// byte a terminal acts on. Such characters can only be inside strings,
/// where the escape means the same character.
pub fn escape_json_text(json: &str) -> Cow<'_, str> {
    // Below U+0020 a JSON writer escaped it inside strings; outside them it
    // is the text's own white space (newlines of pretty printing).
    let raw = |c: char| escaped(c) && u32::from(c) >= 0x7f;
    if !json.contains(raw) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if raw(c) {
            // Every such character is in the Basic Multilingual Plane.
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Shows a string escaped: `format!("{}", Printable(name))`.
#[derive(Clone, Copy, Debug)]
pub struct Printable<'a>(pub &'a str);

impl fmt::Display for Printable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_str(f, self.0)
    }
}

/// Shows a path escaped, byte for byte: its UTF-8 as [`Printable`], any
/// other byte as `\xNN` (where `Path::display` would show U+FFFD).
#[derive(Clone, Copy, Debug)]
pub struct PrintablePath<'a>(pub &'a Path);

impl fmt::Display for PrintablePath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_bytes(f, self.0.as_os_str().as_encoded_bytes())
    }
}

/// A writer that escapes everything written through it into `out`: a
/// `Display` implementation builds its sentence through one, so no piece
/// of it is shown raw.
pub struct Escaping<'a>(pub &'a mut dyn fmt::Write);

impl fmt::Write for Escaping<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        write_str(self.0, s)
    }
}

/// Lowercase hex of `bytes` (an identity, a vault id, a checksum): two
/// digits a byte, printable whatever the bytes.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn controls_are_escaped_and_text_passes() {
        for (raw, shown) in [
            (
                "plain text, Grüße 世界 🚀 \\x1b",
                "plain text, Grüße 世界 🚀 \\x1b",
            ),
            (
                "\u{1b}[2J\u{7}\u{0}\u{b}\u{c}\n\t\r\u{7f}",
                "\\x1b[2J\\x07\\x00\\x0b\\x0c\\x0a\\x09\\x0d\\x7f",
            ),
            ("\u{80}\u{9b}31m\u{9f}", "\\u{80}\\u{9b}31m\\u{9f}"),
            (
                "a\u{202e}b\u{2028}c\u{2066}",
                "a\\u{202e}b\\u{2028}c\\u{2066}",
            ),
        ] {
            assert_eq!(escape(raw), shown);
            assert_eq!(Printable(raw).to_string(), shown);
            assert_eq!(escape(shown), shown, "idempotent");
        }
        assert!(matches!(escape("nothing to do"), Cow::Borrowed(_)));
    }

    #[test]
    fn json_text_keeps_its_value() {
        let text = "{\n  \"a\": \"x\u{7f}\u{9b}\u{202e}y\"\n}";
        let shown = escape_json_text(text);
        assert_eq!(shown, "{\n  \"a\": \"x\\u007f\\u009b\\u202ey\"\n}");
    }

    #[test]
    fn a_path_that_is_not_utf8_shows_its_bytes() {
        let p = Path::new(OsStr::from_bytes(b"/m/\xff\xfe\x1bx.gguf"));
        assert_eq!(PrintablePath(p).to_string(), "/m/\\xff\\xfe\\x1bx.gguf");
        let mut out = String::new();
        let newline = '\n';
        write!(Escaping(&mut out), "a{newline}b").unwrap();
        assert_eq!(out, "a\\x0ab");
    }
}
