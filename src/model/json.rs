//! JSON as smoe reads and writes it: `config.json`,
//! `model.safetensors.index.json`, safetensors headers and a vault's
//! metadata. The syntax is serde_json's; this module adds what a model's
//! files need on top of it:
//!
//! - objects keep their members in document order ([`Value::Object`] is a
//!   list), so a scout's `__metadata__` and an index's shards come out in
//!   the order the source gave them;
//! - a key that appears twice in one object is an error, since formats that
//!   allow it disagree on which one counts (serde_json keeps the last one);
//!   each object checks its keys through a hash set (std's keyed SipHash,
//!   so a crafted document cannot make them collide), linear in the members;
//! - nesting is capped at [`MAX_DEPTH`], below serde_json's own limit;
//! - a long parse can be stopped ([`parse_cancellable`]), and a big object
//!   can be read member by member ([`parse_members`]) without holding it
//!   whole: a million-tensor safetensors header is never a tree;
//! - errors name the byte offset in the text;
//! - a JSON file is read whole only up to [`MAX_JSON_BYTES`] and
//!   [`MAX_JSON_VALUES`] ([`read_json`]); a member of [`parse_members`] holds
//!   at most the caller's cap of values; what a parse builds is allocated
//!   fallibly ([`Cause::NoMemory`]), so a process short of memory gets an
//!   error, not an abort.
//!
//! Numbers are serde_json's: an integer that fits a `u64` (a tensor's byte
//! offset) is exact. It must never panic on untrusted text.
//!
//! Only the safetensors side needs JSON: this module, with serde and
//! serde_json, is built with the `safetensors` feature alone.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::collections::HashSet;
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::io::Read;
use std::path::Path;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

use super::{open_input, Cancel};
use crate::error::{Error, Result as SmoeResult};
use crate::fs_safe::FileState;

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

/// The message of a cancelled parse's error.
const CANCELLED: &str = "cancelled";

/// A parsed JSON value. Objects keep their members in document order
/// (duplicate keys are an error, see [`parse`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `null`
    Null,
    /// `true` or `false`
    Bool(bool),
    /// A number.
    Number(serde_json::Number),
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
            Value::Number(n) => n.as_u64(),
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

    /// Compact JSON text of the value, members in their order.
    pub fn to_json(&self) -> String {
        // Serializing a Value cannot fail: every key is a string, and a
        // String is written to, not a file.
        serde_json::to_string(self).expect("a Value always serializes")
    }
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => serializer.serialize_unit(),
            Value::Bool(b) => serializer.serialize_bool(*b),
            Value::Number(n) => n.serialize(serializer),
            Value::String(s) => serializer.serialize_str(s),
            Value::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Object(members) => {
                let mut map = serializer.serialize_map(Some(members.len()))?;
                for (key, value) in members {
                    map.serialize_entry(key, value)?;
                }
                map.end()
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
        Value::Number(n.into())
    }
}

/// Why a text is not the JSON this parser accepts: the byte offset and
/// what was expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// Byte offset in the text.
    pub offset: usize,
    /// What was wrong.
    pub message: String,
    /// What kind of failure: the text, a cap, or memory.
    pub cause: Cause,
}

/// What stopped a parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The text is not the JSON this parser accepts (or the parse was
    /// cancelled).
    Invalid,
    /// The text holds more values than the caller's cap.
    TooManyValues,
    /// An allocation failed: the process is short of memory.
    NoMemory,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cause {
            Cause::Invalid => write!(f, "invalid JSON at byte {}: {}", self.offset, self.message),
            Cause::TooManyValues => write!(f, "{} (at byte {})", self.message, self.offset),
            Cause::NoMemory => write!(
                f,
                "out of memory: cannot allocate the JSON values read up to byte {}",
                self.offset
            ),
        }
    }
}

impl ParseError {
    /// A serde_json error on `text`, its line and column turned into a byte
    /// offset (serde_json counts columns in bytes, from 1).
    fn of(text: &str, e: &serde_json::Error) -> ParseError {
        let line_start = match e.line() {
            0 | 1 => 0,
            line => text
                .bytes()
                .enumerate()
                .filter(|&(_, b)| b == b'\n')
                .nth(line - 2)
                .map_or(text.len(), |(at, _)| at + 1),
        };
        // At the end of the text serde_json points at the last byte; the
        // error is past it.
        let offset = if e.is_eof() {
            text.len()
        } else {
            (line_start + e.column().saturating_sub(1)).min(text.len())
        };
        // serde_json appends " at line L column C" to what went wrong.
        let message = e.to_string();
        let message = match message.rfind(" at line ") {
            Some(at) if e.line() > 0 => message[..at].to_owned(),
            _ => message,
        };
        ParseError {
            offset,
            message,
            cause: Cause::Invalid,
        }
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
    parse_limited(text, cancelled, u64::MAX)
}

/// [`parse_cancellable`], holding at most `max_values` values (arrays,
/// objects, strings, numbers...; each costs tens of bytes in memory
/// whatever it takes in the text): past it, an error whose cause is
/// [`Cause::TooManyValues`], naming the cap.
pub fn parse_limited(
    text: &str,
    cancelled: &dyn Fn() -> bool,
    max_values: u64,
) -> Result<Value, ParseError> {
    let ctx = Context::new(text, cancelled, max_values);
    let mut de = serde_json::Deserializer::from_str(text);
    let value = ValueSeed {
        ctx: &ctx,
        depth: 0,
    }
    .deserialize(&mut de)
    .and_then(|v| de.end().map(|()| v));
    value.map_err(|e| ctx.error(&e))
}

/// Most values [`read_json`] holds: a JSON file's bytes are capped, but
/// each value costs tens of bytes in memory, so 64 MiB of `[0,0,...]`
/// would cost a gigabyte. An index has about two values an entry
/// (DeepSeek-V3's, about 92,000 entries).
pub const MAX_JSON_VALUES: u64 = 1 << 21;

/// Largest JSON file (`config.json`, `model.safetensors.index.json`)
/// [`read_json`] reads; DeepSeek-V3's index, about 92,000 entries, is 8.9 MB.
pub const MAX_JSON_BYTES: u64 = 64 << 20;

/// Reads the JSON file at `path` (opened without blocking, a regular file,
/// at most [`MAX_JSON_BYTES`] and [`MAX_JSON_VALUES`], UTF-8) and parses
/// it. Returns the value and the file's metadata.
pub fn read_json(path: &Path, cancel: Cancel<'_>) -> SmoeResult<(Value, std::fs::Metadata)> {
    let (text, meta) = read_json_text(path)?;
    let value = parse_limited(&text, cancel, MAX_JSON_VALUES).map_err(|e| match e.cause {
        Cause::NoMemory => crate::try_alloc::no_memory(format_args!(
            "the values of {} (read up to byte {})",
            path.display(),
            e.offset
        )),
        _ => Error::format(format!("{}: {e}", path.display())),
    })?;
    Ok((value, meta))
}

/// The text of the JSON file at `path`, read as [`read_json`] reads it
/// (not yet parsed), and the file's metadata: for a writer that copies a
/// file such as `config.json` byte for byte.
pub fn read_json_text(path: &Path) -> SmoeResult<(String, std::fs::Metadata)> {
    let (file, meta) = open_input(path)?;
    let too_big = |n: u64| {
        Error::format(format!(
            "{}: {n} bytes, above the {} MiB cap on JSON files",
            path.display(),
            MAX_JSON_BYTES >> 20
        ))
    };
    if meta.len() > MAX_JSON_BYTES {
        return Err(too_big(meta.len()));
    }
    // Bounded even if the file grows meanwhile.
    let mut bytes = Vec::new();
    crate::try_alloc::reserve(&mut bytes, meta.len() as usize, || {
        crate::try_alloc::no_memory(format_args!(
            "{} bytes to read {}",
            meta.len(),
            path.display()
        ))
    })?;
    (&file)
        .take(MAX_JSON_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io("cannot read", path, &e))?;
    if bytes.len() as u64 > MAX_JSON_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    // Read whole, so a writer racing the read would leave a mix of two
    // files: it must be as it was when opened.
    let after = file
        .metadata()
        .map_err(|e| Error::io("cannot stat", path, &e))?;
    if let Some(how) = FileState::of(&meta).differs(&FileState::of(&after)) {
        return Err(Error::path_is(
            crate::error::ErrorKind::Io,
            path,
            format!("changed while it was being read: {how}"),
        ));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        Error::format(format!(
            "{}: not UTF-8 (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        ))
    })?;
    Ok((text, meta))
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
/// `cancelled` is asked as in [`parse_cancellable`]; a member's value may
/// hold at most `max_member_values` values (a cap on what one member
/// costs before `member` sees it). The first error of `member` stops the
/// parse.
pub fn parse_members<E>(
    text: &str,
    cancelled: &dyn Fn() -> bool,
    max_member_values: u64,
    member: impl FnMut(String, Value) -> Result<(), E>,
) -> Result<(), MembersError<E>> {
    if !text
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .starts_with('{')
    {
        let v = parse_limited(text, cancelled, max_member_values).map_err(MembersError::Json)?;
        return Err(MembersError::NotObject(v.kind()));
    }
    let ctx = Context::new(text, cancelled, max_member_values);
    let mut seed = MembersSeed {
        ctx: &ctx,
        member,
        refused: None,
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = (&mut seed).deserialize(&mut de).and_then(|()| de.end());
    if let Some(e) = seed.refused {
        return Err(MembersError::Member(e));
    }
    parsed.map_err(|e| MembersError::Json(ctx.error(&e)))
}

/// What every value of one parse shares: the text, the cancel flag and
/// the values left before the next look at it, the values left before the
/// cap, where a duplicate key starts, and why the parse stopped when it was
/// not the text's fault.
struct Context<'c> {
    text: &'c str,
    cancelled: &'c dyn Fn() -> bool,
    countdown: Cell<u32>,
    /// The most values the parse (or one member of [`parse_members`])
    /// holds, and how many more it may.
    limit: u64,
    left: Cell<u64>,
    /// Set when the parse stopped at the cap, or for want of memory.
    stopped: Cell<Option<Cause>>,
    /// The byte offset of the opening quote of the duplicate key that
    /// stopped the parse, when the key is a slice of the text.
    duplicate_at: Cell<Option<usize>>,
}

impl<'c> Context<'c> {
    fn new(text: &'c str, cancelled: &'c dyn Fn() -> bool, limit: u64) -> Context<'c> {
        Context {
            text,
            cancelled,
            countdown: Cell::new(CANCEL_EVERY),
            limit,
            left: Cell::new(limit),
            stopped: Cell::new(None),
            duplicate_at: Cell::new(None),
        }
    }

    /// The error of an allocation that failed.
    fn no_memory<E: de::Error>(&self) -> E {
        self.stopped.set(Some(Cause::NoMemory));
        E::custom("out of memory")
    }

    /// `s`, copied, or the error of an allocation that failed.
    fn string<E: de::Error>(&self, s: &str) -> Result<String, E> {
        crate::try_alloc::string(s).ok_or_else(|| self.no_memory())
    }

    /// Room for one more item in `v`, or the error of an allocation that
    /// failed.
    fn room<T, E: de::Error>(&self, v: &mut Vec<T>) -> Result<(), E> {
        if v.len() == v.capacity() && v.try_reserve(1).is_err() {
            return Err(self.no_memory());
        }
        Ok(())
    }

    /// The error of a key seen twice in one object: it names the key, and
    /// records where the second one starts when it is a slice of the text
    /// (a key without escapes; serde_json reports a position after it).
    fn duplicate<E: de::Error>(&self, key: &str) -> E {
        let start = self.text.as_ptr() as usize;
        let at = (key.as_ptr() as usize).wrapping_sub(start);
        // A key unescaped into a string of its own lies outside the text.
        if (1..=self.text.len()).contains(&at) {
            self.duplicate_at.set(Some(at - 1));
        }
        E::custom(format!("duplicate key \"{key}\""))
    }

    /// `e`, a serde_json error of this parse, as a [`ParseError`].
    fn error(&self, e: &serde_json::Error) -> ParseError {
        let mut error = ParseError::of(self.text, e);
        if let Some(at) = self.duplicate_at.get() {
            error.offset = at;
        }
        if let Some(cause) = self.stopped.get() {
            error.cause = cause;
        }
        error
    }

    /// Counts one value against the cap, then as [`Context::poll`] does.
    fn tick<E: de::Error>(&self) -> Result<(), E> {
        match self.left.get() {
            0 => {
                self.stopped.set(Some(Cause::TooManyValues));
                return Err(E::custom(format!(
                    "more than {} values, this reader's cap",
                    self.limit
                )));
            }
            n => self.left.set(n - 1),
        }
        self.poll()
    }

    /// Every [`CANCEL_EVERY`] calls, fails if the parse is to stop.
    fn poll<E: de::Error>(&self) -> Result<(), E> {
        let left = self.countdown.get() - 1;
        if left > 0 {
            self.countdown.set(left);
            return Ok(());
        }
        self.countdown.set(CANCEL_EVERY);
        if (self.cancelled)() {
            return Err(E::custom(CANCELLED));
        }
        Ok(())
    }
}

/// Fails when an array or object at `depth` would nest deeper than
/// [`MAX_DEPTH`].
fn check_depth<E: de::Error>(depth: usize) -> Result<(), E> {
    if depth > MAX_DEPTH {
        return Err(E::custom(format!("nested deeper than {MAX_DEPTH}")));
    }
    Ok(())
}

/// The keys of one object seen so far, so a duplicate is found in
/// constant time per key. A key spelled without escapes is borrowed from
/// the text, so the set costs no copy of it. Each key is hashed once, with
/// std's keyed SipHash (a crafted document cannot make keys collide), and
/// the set keeps that hash: growing the set rehashes stored numbers instead
/// of reading every key again from all over the text.
#[derive(Default)]
struct KeySet<'de> {
    random: RandomState,
    set: HashSet<SeenKey<'de>, BuildHasherDefault<StoredHash>>,
}

impl<'de> KeySet<'de> {
    /// Adds `key`; false if it was there already, `None` when the set
    /// could not grow (out of memory).
    fn insert(&mut self, key: Cow<'de, str>) -> Option<bool> {
        let hash = self.random.hash_one(&*key);
        if self.set.len() == self.set.capacity() {
            self.set.try_reserve(1).ok()?;
        }
        Some(self.set.insert(SeenKey { hash, key }))
    }

    fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

/// A key with its hash, hashed as that number alone.
struct SeenKey<'de> {
    hash: u64,
    key: Cow<'de, str>,
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

/// Reads one value of any kind (the parse's [`Context`] ticked once).
#[derive(Clone, Copy)]
struct ValueSeed<'a, 'c> {
    ctx: &'a Context<'c>,
    /// Arrays and objects around this value.
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_, '_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        self.ctx.tick()?;
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::Number(n.into()))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(n)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number that is not finite"))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Value, E> {
        self.ctx.string(s).map(Value::String)
    }

    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let depth = self.depth + 1;
        check_depth(depth)?;
        let inner = ValueSeed { depth, ..self };
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(inner)? {
            self.ctx.room(&mut items)?;
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let depth = self.depth + 1;
        check_depth(depth)?;
        let inner = ValueSeed { depth, ..self };
        let mut members: Vec<(String, Value)> = Vec::new();
        // The keys of a large object, filled once it passes SMALL_OBJECT.
        let mut keys = KeySet::default();
        while let Some(key) = map.next_key_seed(KeySeed(self.ctx))? {
            let seen = if members.len() < SMALL_OBJECT {
                members.iter().any(|(k, _)| *k == key)
            } else {
                if keys.is_empty() {
                    // The earlier members' keys, copied once.
                    for (k, _) in &members {
                        keys.insert(Cow::Owned(k.clone()))
                            .ok_or_else(|| self.ctx.no_memory())?;
                    }
                }
                !keys
                    .insert(key.clone())
                    .ok_or_else(|| self.ctx.no_memory())?
            };
            if seen {
                return Err(self.ctx.duplicate(&key));
            }
            let value = map.next_value_seed(inner)?;
            let key = match key {
                Cow::Borrowed(k) => self.ctx.string(k)?,
                Cow::Owned(k) => k,
            };
            self.ctx.room(&mut members)?;
            members.push((key, value));
        }
        Ok(Value::Object(members))
    }
}

/// Reads an object key, borrowed from the text where it has no escape.
struct KeySeed<'a, 'c>(&'a Context<'c>);

impl<'de> DeserializeSeed<'de> for KeySeed<'_, '_> {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_, '_> {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(s))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        self.0.string(s).map(Cow::Owned)
    }

    fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(s))
    }
}

/// Reads the top-level object of [`parse_members`], handing each member to
/// `member`; keeps the callback's error in `refused`.
struct MembersSeed<'a, 'c, F, E> {
    ctx: &'a Context<'c>,
    member: F,
    refused: Option<E>,
}

impl<'de, F, E> DeserializeSeed<'de> for &mut MembersSeed<'_, '_, F, E>
where
    F: FnMut(String, Value) -> Result<(), E>,
{
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        self.ctx.poll()?;
        deserializer.deserialize_map(self)
    }
}

impl<'de, F, E> Visitor<'de> for &mut MembersSeed<'_, '_, F, E>
where
    F: FnMut(String, Value) -> Result<(), E>,
{
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let inner = ValueSeed {
            ctx: self.ctx,
            depth: 1,
        };
        let mut keys = KeySet::default();
        while let Some(key) = map.next_key_seed(KeySeed(self.ctx))? {
            if !keys
                .insert(key.clone())
                .ok_or_else(|| self.ctx.no_memory())?
            {
                return Err(self.ctx.duplicate(&key));
            }
            // Each member's value has the cap to itself.
            self.ctx.left.set(self.ctx.limit);
            let value = map.next_value_seed(inner).map_err(|e| {
                if self.ctx.stopped.get() == Some(Cause::TooManyValues) {
                    let shown: String = key.chars().take(64).collect();
                    de::Error::custom(format!(
                        "the value of {shown:?} holds more than {} values, this reader's cap",
                        self.ctx.limit
                    ))
                } else {
                    e
                }
            })?;
            let key = match key {
                Cow::Borrowed(k) => self.ctx.string(k)?,
                Cow::Owned(k) => k,
            };
            if let Err(e) = (self.member)(key, value) {
                self.refused = Some(e);
                return Err(de::Error::custom("refused"));
            }
        }
        Ok(())
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

    /// Members are written in their order, not sorted.
    #[test]
    fn objects_keep_their_order() {
        let text = r#"{"z":1,"a":{"y":[2,"s"],"b":null}}"#;
        assert_eq!(parse(text).unwrap().to_json(), text);
    }

    #[test]
    fn rejects_with_an_offset() {
        for (text, at) in [
            ("", 0),
            ("{", 1),
            ("{\"a\" 1}", 5),
            ("[1,]", 3),
            ("01", 1),
            ("\"a", 2),
            ("{\"a\":1,\"a\":2}", 7),
            ("1 2", 2),
            ("\"\u{1}\"", 1),
            ("tru", 3),
            ("{\"num_experts\": 4,}", 18),
            ("[1,\n 2,\n x]", 9),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.offset, at, "{text:?}: {e}");
            assert!(!e.message.contains(" at line "), "{e}");
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

    /// A JSON file (config.json, an index) is bounded in values, not only
    /// in bytes: each value costs tens of bytes in memory, so 4 MB of
    /// `[0,0,...]` would cost ten times that and 64 MiB a gigabyte.
    #[test]
    fn a_json_file_of_too_many_values_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        let n = (1usize << 21) + 1;
        std::fs::write(&path, format!("[{}0]", "0,".repeat(n - 1))).unwrap();
        let e = match read_json(&path, &|| false) {
            Ok((v, _)) => format!("read: {} values", v.as_array().map_or(0, <[Value]>::len)),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("config.json") && e.contains("2097152 values"),
            "{e}"
        );
    }

    #[test]
    fn members_are_handed_over_one_by_one() {
        let text = r#" {"a": [1, 2], "b": {"c": null}, "d": "x"} "#;
        let mut seen = Vec::new();
        parse_members::<()>(text, &|| false, u64::MAX, |k, v| {
            seen.push((k, v));
            Ok(())
        })
        .unwrap();
        assert_eq!(Value::Object(seen), parse(text).unwrap());
        // The rules of parse: duplicates, trailing text, not an object.
        let run = |text: &str| parse_members::<()>(text, &|| false, u64::MAX, |_, _| Ok(()));
        assert!(matches!(run(r#"{"a":1,"a":2}"#), Err(MembersError::Json(e)) if e.offset == 7));
        assert!(matches!(run(r#"{"a":1} x"#), Err(MembersError::Json(_))));
        assert!(matches!(
            run("[1]"),
            Err(MembersError::NotObject("an array"))
        ));
        assert!(matches!(run("{"), Err(MembersError::Json(_))));
        // The callback's error stops the parse at that member.
        let mut calls = 0;
        let r = parse_members(r#"{"a":1,"b":2,"c":3}"#, &|| false, u64::MAX, |k, _| {
            calls += 1;
            if k == "b" {
                Err("no b")
            } else {
                Ok(())
            }
        });
        assert!(matches!(r, Err(MembersError::Member("no b"))));
        assert_eq!(calls, 2);
        // A cancelled member-by-member parse stops early too.
        let mut big = String::from("{");
        for i in 0..3 * CANCEL_EVERY {
            big.push_str(&format!("\"k{i}\":0,"));
        }
        big.push_str("\"end\":0}");
        let r = parse_members::<()>(&big, &|| true, u64::MAX, |_, _| Ok(()));
        assert!(
            matches!(&r, Err(MembersError::Json(e)) if e.message == "cancelled" && e.offset < big.len() / 2),
            "{r:?}"
        );
    }
}
