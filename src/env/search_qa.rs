//! The `search-qa` environment: Search-R1's task. The agent thinks, searches
//! a local corpus with BM25 (`<search>query</search>`, top k documents back
//! in `<information>`), and answers; the answer is graded by normalised
//! exact match (or F1) against the golden answers.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use crate::env::action_kind::ActionKind;
use crate::env::bm25::{Bm25Index, Bm25Params};
use crate::env::config::EnvConfig;
use crate::env::corpus::{format_results, Corpus, Document};
use crate::env::episode::Episode;
use crate::env::error::{EnvError, ToolError};
use crate::env::ids::DocId;
use crate::env::normalize::{exact_match, max_f1};
use crate::env::protocol::oracle_text;
use crate::env::tags::Tags;
use crate::env::tool::Tool;
use crate::env::tool_env::{ToolEnv, ToolTask};

/// Search-R1's default number of retrieved documents.
pub const DEFAULT_TOP_K: usize = 3;

/// A corpus with its BM25 index.
#[derive(Debug, Clone)]
pub struct Bm25Retriever {
    corpus: Corpus,
    index: Bm25Index,
}

impl Bm25Retriever {
    /// Indexes every document's title and text.
    pub fn new(corpus: Corpus, params: Bm25Params) -> Self {
        let texts: Vec<String> = corpus.docs().iter().map(Document::indexed_text).collect();
        let index = Bm25Index::build(&texts, params);
        Self { corpus, index }
    }

    /// The documents searched.
    pub fn corpus(&self) -> &Corpus {
        &self.corpus
    }

    /// The `k` best documents with their scores, best first.
    pub fn search(&self, query: &str, k: usize) -> Vec<(&Document, f32)> {
        self.index
            .search(query, k)
            .into_iter()
            .filter_map(|h| self.corpus.docs().get(h.doc).map(|d| (d, h.score)))
            .collect()
    }
}

/// The `search` tool: BM25 top-k, formatted as Search-R1 formats passages.
#[derive(Debug, Clone)]
pub struct SearchTool {
    retriever: Arc<Bm25Retriever>,
    top_k: usize,
}

impl SearchTool {
    /// A tool that answers each query with the `top_k` best documents of
    /// `retriever` (at least one: a `top_k` of 0 counts as 1).
    pub fn new(retriever: Arc<Bm25Retriever>, top_k: usize) -> Self {
        Self {
            retriever,
            top_k: top_k.max(1),
        }
    }
}

#[async_trait]
impl Tool for SearchTool {
    fn name(&self) -> &str {
        "search"
    }

    async fn call(&self, input: &str) -> Result<String, ToolError> {
        let retriever = Arc::clone(&self.retriever);
        let query = input.to_owned();
        let k = self.top_k;
        // Scoring is CPU work; off the async threads it cannot stall other
        // rollouts, and the caller's timeout stays able to fire.
        let text = tokio::task::spawn_blocking(move || {
            let hits = retriever.search(&query, k);
            if hits.is_empty() {
                "No documents found.".to_owned()
            } else {
                format_results(hits.into_iter().map(|(d, _)| d))
            }
        })
        .await
        .map_err(|source| ToolError::Task {
            tool: "search",
            source,
        })?;
        Ok(text)
    }
}

/// The search-qa task: `<search>` calls the tool, the answer is graded by normalised
/// exact match or F1 (as configured), and the oracle searches each gold document's
/// title.
#[derive(Debug, Clone, Default)]
pub struct SearchQa {
    /// Document titles by id, for the oracle's queries (known when the environment
    /// owns its corpus).
    titles: Option<Arc<HashMap<DocId, String>>>,
}

/// The search-qa environment over any search tool.
pub type SearchQaEnv = ToolEnv<SearchQa>;

impl SearchQaEnv {
    /// An environment whose `<search>` calls `tool` (BM25, a dense retriever,
    /// or a test double).
    pub fn new(tool: Arc<dyn Tool>, cfg: EnvConfig) -> Result<Self, EnvError> {
        Self::with_task(SearchQa::default(), tool, cfg)
    }

    /// BM25 over `corpus`, `top_k` documents per search.
    pub fn with_bm25(corpus: Corpus, top_k: usize, cfg: EnvConfig) -> Result<Self, EnvError> {
        let titles = corpus
            .docs()
            .iter()
            .map(|d| (d.id.clone(), d.title.clone()))
            .collect();
        let retriever = Arc::new(Bm25Retriever::new(corpus, Bm25Params::default()));
        let task = SearchQa {
            titles: Some(Arc::new(titles)),
        };
        Self::with_task(task, Arc::new(SearchTool::new(retriever, top_k)), cfg)
    }

    /// BM25 over a `corpus.jsonl` file.
    pub fn from_corpus_file(path: &Path, top_k: usize, cfg: EnvConfig) -> Result<Self, EnvError> {
        Self::with_bm25(Corpus::load_jsonl(path)?, top_k, cfg)
    }
}

impl ToolTask for SearchQa {
    const NAME: &'static str = "search-qa";
    const ACTION: ActionKind = ActionKind::Search;

    /// One search per gold document, in hop order, by the document's title (the
    /// entity it is about; the second hop's is the bridge entity the first document
    /// names), then the first golden answer. Needs the corpus (BM25 environments).
    fn oracle_step(&self, tags: &Tags, episode: &Episode) -> Option<String> {
        let sample = episode.sample();
        let answer = sample.golden_answers.first()?;
        let hop = episode.steps().len();
        match sample.gold_doc_ids.get(hop) {
            Some(doc) if !episode.in_answer_only_turn() => {
                let title = self.titles.as_ref()?.get(doc)?;
                let thought = if hop == 0 {
                    format!("I need to find information about {title}.")
                } else {
                    format!("Now I need to find information about {title}.")
                };
                Some(oracle_text(tags, &thought, &tags.search, title))
            }
            _ => {
                let thought = format!("The documents say the answer is {answer}.");
                Some(oracle_text(tags, &thought, &tags.answer, answer))
            }
        }
    }

    fn judge(&self, answer: &str, golden: &[String]) -> (bool, f64) {
        (exact_match(answer, golden), max_f1(answer, golden))
    }
}
