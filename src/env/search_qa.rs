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
use crate::env::environment::{Environment, Score, StepOutcome};
use crate::env::episode::Episode;
use crate::env::error::{EnvError, ToolError};
use crate::env::ids::DocId;
use crate::env::normalize::{exact_match, max_f1};
use crate::env::prompts::initial_messages;
use crate::env::protocol::{oracle_text, protocol_step, score_episode, stop_strings, ToolSlot};
use crate::env::sample::QaSample;
use crate::env::tool::Tool;

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
        .map_err(|e| ToolError::Failed(format!("search task failed: {e}")))?;
        Ok(text)
    }
}

/// The search-qa environment over any search tool.
#[derive(Clone)]
pub struct SearchQaEnv {
    cfg: EnvConfig,
    slot: ToolSlot,
    /// Document titles by id, for the oracle's queries (known when the environment
    /// owns its corpus).
    titles: Option<Arc<HashMap<DocId, String>>>,
}

impl SearchQaEnv {
    /// An environment whose `<search>` calls `tool` (BM25, a dense retriever,
    /// or a test double).
    pub fn new(tool: Arc<dyn Tool>, cfg: EnvConfig) -> Result<Self, EnvError> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            slot: ToolSlot {
                kind: ActionKind::Search,
                tool,
            },
            titles: None,
        })
    }

    /// BM25 over `corpus`, `top_k` documents per search.
    pub fn with_bm25(corpus: Corpus, top_k: usize, cfg: EnvConfig) -> Result<Self, EnvError> {
        let titles = corpus
            .docs()
            .iter()
            .map(|d| (d.id.clone(), d.title.clone()))
            .collect();
        let retriever = Arc::new(Bm25Retriever::new(corpus, Bm25Params::default()));
        let mut env = Self::new(Arc::new(SearchTool::new(retriever, top_k)), cfg)?;
        env.titles = Some(Arc::new(titles));
        Ok(env)
    }

    /// BM25 over a `corpus.jsonl` file.
    pub fn from_corpus_file(path: &Path, top_k: usize, cfg: EnvConfig) -> Result<Self, EnvError> {
        Self::with_bm25(Corpus::load_jsonl(path)?, top_k, cfg)
    }
}

#[async_trait]
impl Environment for SearchQaEnv {
    fn name(&self) -> &str {
        "search-qa"
    }

    fn config(&self) -> &EnvConfig {
        &self.cfg
    }

    fn stop_strings(&self) -> Vec<String> {
        stop_strings(&self.cfg.tags, ActionKind::Search)
    }

    fn start(&self, sample: &QaSample) -> Result<Episode, EnvError> {
        let prompt = initial_messages(
            ActionKind::Search,
            &self.cfg.tags,
            self.cfg.max_turns,
            &sample.question,
        );
        Ok(Episode::new(sample.clone(), prompt, self.cfg.max_turns))
    }

    async fn step(&self, episode: &mut Episode, step_text: &str) -> Result<StepOutcome, EnvError> {
        protocol_step(&self.cfg, &self.slot, episode, step_text).await
    }

    /// One search per gold document, in hop order, by the document's title (the
    /// entity it is about; the second hop's is the bridge entity the first document
    /// names), then the first golden answer. Needs the corpus (BM25 environments).
    fn oracle_step(&self, episode: &Episode) -> Option<String> {
        let sample = episode.sample();
        let answer = sample.golden_answers.first()?;
        let tags = &self.cfg.tags;
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

    fn score(&self, episode: &Episode) -> Score {
        let reward = &self.cfg.reward;
        score_episode(episode, reward, reward.metric, |answer, golden| {
            (exact_match(answer, golden), max_f1(answer, golden))
        })
    }
}
