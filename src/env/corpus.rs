//! A document corpus in FlashRAG / Search-R1 wiki form: JSONL of
//! `{"id","contents"}` where the first line of `contents` is the title,
//! written `"Title"` with quotes, and the rest is the text.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::env::error::EnvError;
use crate::env::ids::DocId;
use crate::env::jsonl::{parse_jsonl_lines, read_jsonl_lines, write_jsonl};

/// One corpus line as stored on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CorpusRecord {
    /// The document's id, unique in the corpus.
    pub id: DocId,
    /// `"Title"` on the first line, the text after it.
    pub contents: String,
}

/// A parsed document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// The document's id, unique in the corpus.
    pub id: DocId,
    /// The title, without the quotes it is stored with.
    pub title: String,
    /// The body after the title line (may be empty).
    pub text: String,
}

impl Document {
    /// Splits `contents` at the first newline like FlashRAG does
    /// (`contents.split("\n")[0]` is the title); the quotes the wiki dumps
    /// put around the title are stripped. No newline: all title, no text.
    pub fn from_record(record: CorpusRecord) -> Self {
        let (title, text) = match record.contents.split_once('\n') {
            Some((t, rest)) => (t, rest),
            None => (record.contents.as_str(), ""),
        };
        let title = title.trim();
        let title = title
            .strip_prefix('"')
            .and_then(|t| t.strip_suffix('"'))
            .unwrap_or(title);
        Self {
            title: title.to_owned(),
            text: text.to_owned(),
            id: record.id,
        }
    }

    /// The on-disk form, `"Title"\ntext`.
    pub fn to_record(&self) -> CorpusRecord {
        CorpusRecord {
            id: self.id.clone(),
            contents: format!("\"{}\"\n{}", self.title, self.text),
        }
    }

    /// What gets indexed: title and text, as pyserini indexes `contents`.
    pub fn indexed_text(&self) -> String {
        format!("{}\n{}", self.title, self.text)
    }
}

/// Documents with an id lookup.
#[derive(Debug, Clone, Default)]
pub struct Corpus {
    docs: Vec<Document>,
    by_id: HashMap<DocId, usize>,
}

impl Corpus {
    /// Builds a corpus; duplicate ids are a data bug.
    pub fn new(docs: Vec<Document>) -> Result<Self, EnvError> {
        let mut by_id = HashMap::with_capacity(docs.len());
        for (i, d) in docs.iter().enumerate() {
            if by_id.insert(d.id.clone(), i).is_some() {
                return Err(EnvError::Config(format!("duplicate document id {}", d.id)));
            }
        }
        Ok(Self { docs, by_id })
    }

    /// Loads `corpus.jsonl`.
    pub fn load_jsonl(path: &Path) -> Result<Self, EnvError> {
        Self::from_records(read_jsonl_lines(path)?, path)
    }

    /// Parses the text of a `corpus.jsonl` that came from `path`.
    pub fn parse_jsonl(text: &str, path: &Path) -> Result<Self, EnvError> {
        Self::from_records(parse_jsonl_lines(text, path)?, path)
    }

    fn from_records(records: Vec<(usize, CorpusRecord)>, path: &Path) -> Result<Self, EnvError> {
        let mut docs = Vec::with_capacity(records.len());
        let mut by_id = HashMap::with_capacity(records.len());
        for (line, record) in records {
            if by_id.insert(record.id.clone(), docs.len()).is_some() {
                return Err(EnvError::BadRecord {
                    path: path.to_owned(),
                    line,
                    reason: format!("duplicate document id {}", record.id),
                });
            }
            docs.push(Document::from_record(record));
        }
        Ok(Self { docs, by_id })
    }

    /// Writes `corpus.jsonl`.
    pub fn write_jsonl(&self, path: &Path) -> Result<(), EnvError> {
        let records: Vec<CorpusRecord> = self.docs.iter().map(Document::to_record).collect();
        write_jsonl(path, &records)
    }

    /// Every document, in load order (the order the search index numbers them in).
    pub fn docs(&self) -> &[Document] {
        &self.docs
    }

    /// The number of documents.
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    /// Whether the corpus has no document.
    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    /// The document with id `id`, if the corpus has it.
    pub fn get(&self, id: &DocId) -> Option<&Document> {
        self.by_id.get(id).map(|&i| &self.docs[i])
    }
}

/// Search-R1's `_passages2string`: `Doc 1(Title: T) text` lines joined by
/// newlines (Search-R1 strips the trailing newline when it wraps the result
/// in `<information>`, so none is emitted here).
pub fn format_results<'a>(docs: impl IntoIterator<Item = &'a Document>) -> String {
    docs.into_iter()
        .enumerate()
        .map(|(i, d)| format!("Doc {}(Title: {}) {}", i + 1, d.title, d.text.trim()))
        .collect::<Vec<_>>()
        .join("\n")
}
