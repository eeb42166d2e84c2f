//! A small JSON reader and writer for the formats smoe touches: vault
//! metadata (its `layer_blob_layouts`), safetensors headers and their
//! `model.safetensors.index.json`.
//!
//! The library keeps no JSON dependency (hosts link it statically and the
//! C ABI must stay lean), and these documents are small and flat, so a
//! strict recursive-descent parser is enough. It must never panic or
//! recurse without bound on untrusted text: nesting is capped at
//! [`MAX_DEPTH`], every error names the byte offset, and numbers keep their
//! source text so that a `u64` offset above 2^53 is read exactly.

use std::borrow::Cow;
use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::fmt::Write as _;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};

/// Deepest nesting of arrays and objects the parser accepts.
pub const MAX_DEPTH: usize = 64;

/// An object with more members than this checks its keys for duplicates
/// through a hash set; a smaller one compares each key with the earlier
/// ones (cheaper for the small objects that make up most documents). Either
/// way the check is linear in the members.
const SMALL_OBJECT: usize = 16;

/// Values parsed between two looks at the cancel flag of
/// [`parse_cancellable`].
const CANCEL_EVERY: u32 = 1 << 16;

/// A parsed JSON value. Objects keep their members in document order
/// (duplicate keys are an error, see [`parse`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `null`
    Null,
    /// `true` or `false`
    Bool(bool),
    /// A number, as written in the source (valid JSON number syntax).
    Number(String),
    /// A string, unescaped.
    String(String),
    /// An array.
    Array(Vec<Value>),
    /// An object: (key, value) in document order.
    Object(Vec<(String, Value)>),
}

impl Value {
    /// The member `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The number as a `u64`, if it is a non-negative integer that fits.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Number(n) => n.parse().ok(),
            _ => None,
        }
    }

    /// The elements, if this is an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The members, if this is an object.
    pub fn as_object(&self) -> Option<&[(String, Value)]> {
        match self {
            Value::Object(m) => Some(m),
            _ => None,
        }
    }

    /// A short name of the value's kind, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => "an object",
        }
    }

    /// Compact JSON text of the value.
    pub fn to_json(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) {
        match self {
            Value::Null => out.push_str("null"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Number(n) => out.push_str(n),
            Value::String(s) => write_string(out, s),
            Value::Array(a) => {
                out.push('[');
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.write(out);
                }
                out.push(']');
            }
            Value::Object(m) => {
                out.push('{');
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_string(out, k);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::String(s)
    }
}

impl From<u64> for Value {
    fn from(n: u64) -> Value {
        Value::Number(n.to_string())
    }
}

/// Appends `s` as a JSON string literal.
pub fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Why a text is not the JSON this parser accepts: the byte offset and
/// what was expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// Byte offset in the text.
    pub offset: usize,
    /// What was wrong.
    pub message: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid JSON at byte {}: {}", self.offset, self.message)
    }
}

/// Parses one JSON value filling the whole text (surrounding white space
/// allowed). Duplicate keys in an object are an error, since formats that
/// allow them disagree on which one counts.
pub fn parse(text: &str) -> Result<Value, ParseError> {
    parse_cancellable(text, &|| false)
}

/// [`parse`], asking `cancelled` every 65,536 values whether to stop: a
/// 100 MB document takes a while, and a person who pressed Ctrl-C should
/// not wait for it. A cancelled parse is an error whose message is
/// `"cancelled"`.
pub fn parse_cancellable(text: &str, cancelled: &dyn Fn() -> bool) -> Result<Value, ParseError> {
    let mut p = Parser {
        text,
        bytes: text.as_bytes(),
        at: 0,
        cancelled,
        countdown: CANCEL_EVERY,
    };
    p.skip_ws();
    let v = p.value(0)?;
    p.skip_ws();
    if p.at != p.bytes.len() {
        return Err(p.error("text after the value"));
    }
    Ok(v)
}

/// A key as the duplicate check keeps it: `raw`, its spelling in the text
/// between the quotes, when that has no escape (it is then the key), else
/// a copy of the unescaped `key`.
fn key_of<'a>(key: &str, raw: &'a str) -> Cow<'a, str> {
    // An escape always spells more bytes than it stands for.
    if raw.len() == key.len() {
        Cow::Borrowed(raw)
    } else {
        Cow::Owned(key.to_owned())
    }
}

/// The keys of one object seen so far, so a duplicate is found in
/// constant time per key (a list compared key by key made a 200,000-entry
/// index take 31 s). Each key is hashed once, with std's keyed SipHash (a
/// crafted document cannot make keys collide), and the set keeps that hash:
/// growing the set rehashes stored numbers instead of reading every key
/// again from all over the text.
#[derive(Default)]
struct KeySet<'a> {
    random: RandomState,
    set: HashSet<SeenKey<'a>, BuildHasherDefault<StoredHash>>,
}

impl<'a> KeySet<'a> {
    /// Adds `key`; false if it was there already.
    fn insert(&mut self, key: Cow<'a, str>) -> bool {
        let hash = self.random.hash_one(&*key);
        self.set.insert(SeenKey { hash, key })
    }

    fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

/// A key with its hash, hashed as that number alone.
struct SeenKey<'a> {
    hash: u64,
    key: Cow<'a, str>,
}

impl Hash for SeenKey<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialEq for SeenKey<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for SeenKey<'_> {}

/// The hasher of [`KeySet`]'s table: its hash is the `u64` written, the
/// stored SipHash of a [`SeenKey`].
#[derive(Default)]
struct StoredHash(u64);

impl Hasher for StoredHash {
    fn write(&mut self, bytes: &[u8]) {
        // Only write_u64 is ever called (by SeenKey); fold anything else.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Why [`parse_members`] stopped.
#[derive(Debug)]
pub enum MembersError<E> {
    /// The text is not JSON.
    Json(ParseError),
    /// The text is a JSON value of this kind, not an object.
    NotObject(&'static str),
    /// `member` refused a member.
    Member(E),
}

/// Parses a text that holds one JSON object, handing each member to
/// `member` as soon as it is read instead of building the object, so a
/// document of a million members is never held whole (a safetensors
/// header). The rules are [`parse`]'s, duplicate keys included;
/// `cancelled` is asked as in [`parse_cancellable`]. The first error of
/// `member` stops the parse.
pub fn parse_members<E>(
    text: &str,
    cancelled: &dyn Fn() -> bool,
    mut member: impl FnMut(String, Value) -> Result<(), E>,
) -> Result<(), MembersError<E>> {
    let mut p = Parser {
        text,
        bytes: text.as_bytes(),
        at: 0,
        cancelled,
        countdown: CANCEL_EVERY,
    };
    p.skip_ws();
    if p.peek() != Some(b'{') {
        let v = parse_cancellable(text, cancelled).map_err(MembersError::Json)?;
        return Err(MembersError::NotObject(v.kind()));
    }
    let mut refused = None;
    let mut keys = KeySet::default();
    let parsed = p.sequence(1, b'}', |p| {
        if p.peek() != Some(b'"') {
            return Err(p.error("expected a string key"));
        }
        let key_at = p.at;
        let key = p.string()?;
        if !keys.insert(key_of(&key, &text[key_at + 1..p.at - 1])) {
            return Err(ParseError {
                offset: key_at,
                message: format!("duplicate key \"{key}\""),
            });
        }
        p.skip_ws();
        p.expect(b':')?;
        p.skip_ws();
        let value = p.value(1)?;
        member(key, value).map_err(|e| {
            refused = Some(e);
            p.error("refused")
        })
    });
    if let Some(e) = refused {
        return Err(MembersError::Member(e));
    }
    parsed.map_err(MembersError::Json)?;
    p.skip_ws();
    if p.at != p.bytes.len() {
        return Err(MembersError::Json(p.error("text after the value")));
    }
    Ok(())
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
    cancelled: &'a dyn Fn() -> bool,
    /// Values left before the next look at `cancelled`.
    countdown: u32,
}

impl<'a> Parser<'a> {
    fn error(&self, message: impl Into<String>) -> ParseError {
        ParseError {
            offset: self.at,
            message: message.into(),
        }
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.at) {
            self.at += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn expect(&mut self, byte: u8) -> Result<(), ParseError> {
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(self.error(format!("expected '{}'", byte as char)))
        }
    }

    fn literal(&mut self, word: &str, value: Value) -> Result<Value, ParseError> {
        if self.bytes[self.at..].starts_with(word.as_bytes()) {
            self.at += word.len();
            Ok(value)
        } else {
            Err(self.error(format!("expected {word}")))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, ParseError> {
        self.countdown -= 1;
        if self.countdown == 0 {
            self.countdown = CANCEL_EVERY;
            if (self.cancelled)() {
                return Err(self.error("cancelled"));
            }
        }
        match self.peek() {
            None => Err(self.error("unexpected end of text")),
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b't') => self.literal("true", Value::Bool(true)),
            Some(b'f') => self.literal("false", Value::Bool(false)),
            Some(b'n') => self.literal("null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b) => Err(self.error(format!("unexpected byte 0x{b:02x}"))),
        }
    }

    /// Parses the items of an array or object after its opening byte, up
    /// to `close`, calling `item` for each (at its first byte).
    fn sequence(
        &mut self,
        depth: usize,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Result<(), ParseError>,
    ) -> Result<(), ParseError> {
        if depth > MAX_DEPTH {
            return Err(self.error(format!("nested deeper than {MAX_DEPTH}")));
        }
        self.at += 1;
        self.skip_ws();
        if self.peek() == Some(close) {
            self.at += 1;
            return Ok(());
        }
        loop {
            self.skip_ws();
            item(self)?;
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b) if b == close => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(self.error(format!("expected ',' or '{}'", close as char))),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, ParseError> {
        let mut members: Vec<(String, Value)> = Vec::new();
        // The keys of a large object, filled once it passes SMALL_OBJECT:
        // borrowed from the text where it spells the key without escapes
        // (most keys), so the set costs no copy of them.
        let mut keys = KeySet::default();
        let text = self.text;
        self.sequence(depth, b'}', |p| {
            if p.peek() != Some(b'"') {
                return Err(p.error("expected a string key"));
            }
            let key_at = p.at;
            let key = p.string()?;
            let duplicate = if members.len() < SMALL_OBJECT {
                members.iter().any(|(k, _)| *k == key)
            } else {
                if keys.is_empty() {
                    // The earlier members' keys, from their own text.
                    for (k, _) in &members {
                        keys.insert(Cow::Owned(k.clone()));
                    }
                }
                !keys.insert(key_of(&key, &text[key_at + 1..p.at - 1]))
            };
            if duplicate {
                return Err(ParseError {
                    offset: key_at,
                    message: format!("duplicate key \"{key}\""),
                });
            }
            p.skip_ws();
            p.expect(b':')?;
            p.skip_ws();
            members.push((key, p.value(depth)?));
            Ok(())
        })?;
        Ok(Value::Object(members))
    }

    fn array(&mut self, depth: usize) -> Result<Value, ParseError> {
        let mut items = Vec::new();
        self.sequence(depth, b']', |p| {
            items.push(p.value(depth)?);
            Ok(())
        })?;
        Ok(Value::Array(items))
    }

    fn hex4(&mut self) -> Result<u32, ParseError> {
        let digits = self
            .bytes
            .get(self.at..self.at + 4)
            .ok_or_else(|| self.error("truncated \\u escape"))?;
        let text = std::str::from_utf8(digits).map_err(|_| self.error("bad \\u escape"))?;
        let v = u32::from_str_radix(text, 16).map_err(|_| self.error("bad \\u escape"))?;
        self.at += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, ParseError> {
        self.at += 1; // the opening quote
        let mut out = String::new();
        loop {
            // Copy the run up to the next quote, backslash or control byte.
            let start = self.at;
            while let Some(&b) = self.bytes.get(self.at) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.at += 1;
            }
            // The run starts and stops at ASCII bytes (or the end), so both
            // ends are char boundaries of the text: no need to check it again.
            out.push_str(&self.text[start..self.at]);
            match self.peek() {
                None => return Err(self.error("unterminated string")),
                Some(b'"') => {
                    self.at += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.at += 1;
                    let escaped = self
                        .peek()
                        .ok_or_else(|| self.error("unterminated escape"))?;
                    self.at += 1;
                    match escaped {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let c = if (0xD800..0xDC00).contains(&hi) {
                                if !self.bytes[self.at..].starts_with(b"\\u") {
                                    return Err(self.error("lone high surrogate"));
                                }
                                self.at += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(self.error("bad low surrogate"));
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            out.push(
                                char::from_u32(c).ok_or_else(|| self.error("bad \\u escape"))?,
                            );
                        }
                        _ => return Err(self.error("unknown escape")),
                    }
                }
                Some(_) => return Err(self.error("control byte in a string")),
            }
        }
    }

    fn number(&mut self) -> Result<Value, ParseError> {
        let start = self.at;
        let bad_number = |offset| ParseError {
            offset,
            message: "bad number".into(),
        };
        let digits = |p: &mut Self| {
            let s = p.at;
            while let Some(b'0'..=b'9') = p.peek() {
                p.at += 1;
            }
            p.at - s
        };
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        let int_start = self.at;
        let n = digits(self);
        if n == 0 || (n > 1 && self.bytes[int_start] == b'0') {
            return Err(bad_number(start));
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if digits(self) == 0 {
                return Err(bad_number(start));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if digits(self) == 0 {
                return Err(bad_number(start));
            }
        }
        // ASCII digits and signs only: char boundaries of the text.
        Ok(Value::Number(self.text[start..self.at].to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_writes_back() {
        let text = r#"{"a":[1,-2.5e3,true,false,null],"b":"x\"\\\n\u00e9\ud83d\ude00","c":{}}"#;
        let v = parse(text).unwrap();
        assert_eq!(v.get("a").unwrap().as_array().unwrap().len(), 5);
        assert_eq!(v.get("b").unwrap().as_str().unwrap(), "x\"\\\né😀");
        assert_eq!(parse(&v.to_json()).unwrap(), v);
        assert_eq!(
            parse("18446744073709551615").unwrap().as_u64(),
            Some(u64::MAX),
            "u64 offsets are exact"
        );
    }

    #[test]
    fn rejects_with_an_offset() {
        for (text, at) in [
            ("", 0),
            ("{", 1),
            ("{\"a\" 1}", 5),
            ("[1,]", 3),
            ("01", 0),
            ("\"a", 2),
            ("{\"a\":1,\"a\":2}", 7),
            ("1 2", 2),
            ("\"\u{1}\"", 1),
            ("tru", 0),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.offset, at, "{text:?}: {e}");
        }
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert!(parse(&deep).unwrap_err().message.contains("nested"));
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(parse(&ok).is_ok());
    }

    /// A large object's duplicate is found (through the hash set) at the
    /// second key's offset, whether it repeats an early or a late key.
    #[test]
    fn duplicates_in_a_large_object() {
        for (n, dup) in [(SMALL_OBJECT, 0), (100, 3), (100, 99), (5000, 4321)] {
            let mut text = String::from("{");
            for i in 0..n {
                text.push_str(&format!("\"k{i}\":{i},"));
            }
            let at = text.len();
            text.push_str(&format!("\"k{dup}\":0}}"));
            let e = parse(&text).unwrap_err();
            assert_eq!(e.offset, at, "{n} members, duplicate of k{dup}: {e}");
            assert!(e.message.contains(&format!("\"k{dup}\"")), "{e}");
            let ok = text[..at].to_owned() + "\"new\":0}";
            assert_eq!(parse(&ok).unwrap().as_object().unwrap().len(), n + 1);
        }
    }

    #[test]
    fn a_cancelled_parse_stops() {
        let text = format!("[{}0]", "0,".repeat(3 * CANCEL_EVERY as usize));
        assert!(parse_cancellable(&text, &|| false).is_ok());
        let e = parse_cancellable(&text, &|| true).unwrap_err();
        assert_eq!(e.message, "cancelled");
        assert!(e.offset < text.len() / 2, "stopped early: {e}");
    }

    /// A key spelled with an escape is the same key as its plain spelling,
    /// in a small object and in a large one.
    #[test]
    fn an_escaped_duplicate_is_a_duplicate() {
        assert!(parse(r#"{"a":1,"\u0061":2}"#).is_err());
        let mut text = String::from("{");
        for i in 0..100 {
            text.push_str(&format!("\"k{i}\":{i},"));
        }
        assert!(
            parse(&(text.clone() + r#""\u006b7":0}"#)).is_err(),
            "k7 escaped"
        );
        assert!(parse(&(text.clone() + r#""k\n":0,"k\n":1}"#)).is_err());
        assert!(parse(&(text + r#""k\n":0,"k\t":1}"#)).is_ok());
    }

    #[test]
    fn members_are_handed_over_one_by_one() {
        let text = r#" {"a": [1, 2], "b": {"c": null}, "d": "x"} "#;
        let mut seen = Vec::new();
        parse_members::<()>(text, &|| false, |k, v| {
            seen.push((k, v));
            Ok(())
        })
        .unwrap();
        assert_eq!(Value::Object(seen), parse(text).unwrap());
        // The rules of parse: duplicates, trailing text, not an object.
        let run = |text: &str| parse_members::<()>(text, &|| false, |_, _| Ok(()));
        assert!(matches!(run(r#"{"a":1,"a":2}"#), Err(MembersError::Json(e)) if e.offset == 7));
        assert!(matches!(run(r#"{"a":1} x"#), Err(MembersError::Json(_))));
        assert!(matches!(
            run("[1]"),
            Err(MembersError::NotObject("an array"))
        ));
        assert!(matches!(run("{"), Err(MembersError::Json(_))));
        // The callback's error stops the parse at that member.
        let mut calls = 0;
        let r = parse_members(r#"{"a":1,"b":2,"c":3}"#, &|| false, |k, _| {
            calls += 1;
            if k == "b" {
                Err("no b")
            } else {
                Ok(())
            }
        });
        assert!(matches!(r, Err(MembersError::Member("no b"))));
        assert_eq!(calls, 2);
    }
}
