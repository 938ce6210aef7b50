//! The fields each endpoint reads, checked before its body is: a field an endpoint
//! does not know is a 400 naming it, never silently ignored (a client that sends
//! `mirostat` or a misspelt `repetition_penallty` must learn it had no effect).
//!
//! Types without `#[serde(flatten)]` refuse unknown fields through serde's own
//! `deny_unknown_fields`; serde cannot do that across a flatten, so the endpoints
//! whose bodies share fields (OpenAI's two, the sampling parameters) check theirs
//! here, against the lists the shared structs' derived `Deserialize` announces
//! ([`fields_of`]): a field added to the struct is known at once.

use serde::de::{Deserialize, Deserializer, Visitor};
use serde_json::Value;

/// OpenAI request fields accepted and ignored: they change nothing a client could
/// observe here (one model is served; no storage, no tiers, no user tracking).
pub const ACCEPTED_IGNORED: &[&str] = &["model", "user", "metadata", "store", "service_tier"];

/// The field names (aliases included) serde's derived `Deserialize` of the struct `T`
/// reads, so a list of known fields is the struct's own and cannot drift from it.
/// `T` must be a struct without `#[serde(flatten)]` (those deserialise as maps and
/// name no fields: the list is then empty, which the tests of each list would show).
pub fn fields_of<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut names: &'static [&'static str] = &[];
    let _ = T::deserialize(FieldNames(&mut names));
    names
}

/// A deserializer that only records the field list a derived struct announces.
struct FieldNames<'a>(&'a mut &'static [&'static str]);

#[derive(Debug)]
struct Recorded;

impl std::fmt::Display for Recorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("field names recorded")
    }
}

impl std::error::Error for Recorded {}

impl serde::de::Error for Recorded {
    fn custom<M: std::fmt::Display>(_: M) -> Self {
        Recorded
    }
}

impl<'de> Deserializer<'de> for FieldNames<'_> {
    type Error = Recorded;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Recorded> {
        *self.0 = fields;
        Err(Recorded)
    }

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Recorded> {
        Err(Recorded)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
        identifier ignored_any
    }
}

/// A request body whose unknown fields are found before it is read.
pub trait KnownFields {
    /// The first field of `body` this endpoint does not read (its path, dotted for
    /// nested objects); `None` when all are known or serde refuses them itself.
    fn unknown_field(_body: &Value) -> Option<String> {
        None
    }
}

/// The first key of the object `body` in none of `lists`, prefixed by `at`.
pub fn first_unknown(body: &Value, at: &str, lists: &[&[&str]]) -> Option<String> {
    body.as_object()?
        .keys()
        .find(|k| !lists.iter().any(|l| l.contains(&k.as_str())))
        .map(|k| format!("{at}{k}"))
}
