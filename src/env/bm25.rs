//! BM25 retrieval, written here rather than taken from crates.io.
//!
//! Why our own: the `bm25` crate's default tokenizer pulls in five more
//! crates (stemmers, caches, unicode segmentation) and without it we would
//! write the tokenizer anyway; the scorer itself is ~100 lines. Owning it
//! also pins the exact behaviour the tests measure: Lucene's BM25 (what
//! pyserini, and so Search-R1's BM25 retriever, uses) with pyserini's
//! defaults k1 = 0.9, b = 0.4, and deterministic tie-breaking.
//!
//! Tokenizer: lowercase, split on anything not alphanumeric, drop a small
//! English stop-word list (question words included, since queries are
//! questions). No stemming: fictional names dominate the generated corpus
//! and stemming would only merge them by accident.

use std::collections::HashMap;

/// Words too common to carry meaning in a query or a document.
const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "been", "by", "did", "do", "does", "for", "from",
    "had", "has", "have", "how", "in", "is", "it", "its", "of", "on", "or", "that", "the", "this",
    "to", "was", "were", "what", "when", "where", "which", "who", "whom", "why", "with",
];

/// Lowercased alphanumeric tokens without stop words.
pub fn tokenize(text: &str) -> Vec<String> {
    text.to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty() && !STOP_WORDS.contains(t))
        .map(str::to_owned)
        .collect()
}

/// BM25 parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bm25Params {
    /// Term-frequency saturation: how much a term's repeats in one document keep
    /// adding to its score (0 = not at all; pyserini's default 0.9).
    pub k1: f32,
    /// Length normalisation, in `0..=1`: how much a document longer than the average
    /// is discounted (0 = not at all; pyserini's default 0.4).
    pub b: f32,
}

impl Default for Bm25Params {
    /// pyserini's defaults.
    fn default() -> Self {
        Self { k1: 0.9, b: 0.4 }
    }
}

/// An inverted index over documents numbered `0..n` in insertion order.
#[derive(Debug, Clone)]
pub struct Bm25Index {
    params: Bm25Params,
    vocab: HashMap<String, usize>,
    /// Per term: (document number, term frequency), document numbers ascending.
    postings: Vec<Vec<(u32, u32)>>,
    doc_len: Vec<u32>,
    avg_len: f32,
}

/// One hit: the document's number in the index and its score.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hit {
    /// The document's number: its position in the texts given to
    /// [`Bm25Index::build`].
    pub doc: usize,
    /// Its BM25 score for the query (positive; higher is better).
    pub score: f32,
}

impl Bm25Index {
    /// Indexes `texts` in order.
    pub fn build<S: AsRef<str>>(texts: &[S], params: Bm25Params) -> Self {
        let mut vocab: HashMap<String, usize> = HashMap::new();
        let mut postings: Vec<Vec<(u32, u32)>> = Vec::new();
        let mut doc_len = Vec::with_capacity(texts.len());
        for (doc, text) in texts.iter().enumerate() {
            let tokens = tokenize(text.as_ref());
            doc_len.push(tokens.len() as u32);
            let mut tf: HashMap<String, u32> = HashMap::new();
            for t in tokens {
                *tf.entry(t).or_insert(0) += 1;
            }
            for (term, count) in tf {
                let next = postings.len();
                let id = *vocab.entry(term).or_insert(next);
                if id == postings.len() {
                    postings.push(Vec::new());
                }
                postings[id].push((doc as u32, count));
            }
        }
        let total: u64 = doc_len.iter().map(|&l| u64::from(l)).sum();
        let avg_len = if doc_len.is_empty() {
            1.0
        } else {
            (total as f32 / doc_len.len() as f32).max(1.0)
        };
        Self {
            params,
            vocab,
            postings,
            doc_len,
            avg_len,
        }
    }

    /// The number of documents indexed.
    pub fn len(&self) -> usize {
        self.doc_len.len()
    }

    /// Whether no document is indexed (every search then finds nothing).
    pub fn is_empty(&self) -> bool {
        self.doc_len.is_empty()
    }

    /// Lucene's idf: ln(1 + (N - df + 0.5) / (df + 0.5)), always positive.
    fn idf(&self, df: usize) -> f32 {
        let n = self.len() as f32;
        let df = df as f32;
        (1.0 + (n - df + 0.5) / (df + 0.5)).ln()
    }

    /// The `k` best documents for `query`, best first. Ties go to the lower
    /// document number so results are reproducible. A query term repeated
    /// counts again, as repeated clauses do in a Lucene bag-of-words query.
    pub fn search(&self, query: &str, k: usize) -> Vec<Hit> {
        let Bm25Params { k1, b } = self.params;
        // Sparse accumulator: a dense one would cost O(N) per query on a
        // Wikipedia-sized corpus.
        let mut scores: HashMap<u32, f32> = HashMap::new();
        for term in tokenize(query) {
            let Some(&id) = self.vocab.get(&term) else {
                continue;
            };
            let list = &self.postings[id];
            let idf = self.idf(list.len());
            for &(doc, tf) in list {
                let tf = tf as f32;
                let len = self.doc_len[doc as usize] as f32;
                let norm = k1 * (1.0 - b + b * len / self.avg_len);
                *scores.entry(doc).or_insert(0.0) += idf * tf / (tf + norm);
            }
        }
        let mut hits: Vec<Hit> = scores
            .into_iter()
            .map(|(doc, score)| Hit {
                doc: doc as usize,
                score,
            })
            .collect();
        hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.doc.cmp(&b.doc)));
        hits.truncate(k);
        hits
    }
}
