//! Newtype ids that cross API boundaries, so a document id is never passed
//! where a sample id is expected.
//!
//! FlashRAG files carry ids as strings in some data sets and as numbers in
//! others; both deserialize, and serialization always writes a string.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

macro_rules! string_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The id with text `id` (any string; ids are compared as text).
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into())
            }
            /// The id's text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                Ok(Self(RawId::deserialize(d)?.into_string()))
            }
        }
    };
}

/// Either form an id takes in the wild.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawId {
    Text(String),
    Unsigned(u64),
    Signed(i64),
}

impl RawId {
    fn into_string(self) -> String {
        match self {
            RawId::Text(s) => s,
            RawId::Unsigned(n) => n.to_string(),
            RawId::Signed(n) => n.to_string(),
        }
    }
}

string_id!(
    /// Id of a task sample (a question or a problem).
    SampleId
);
string_id!(
    /// Id of a corpus document.
    DocId
);
