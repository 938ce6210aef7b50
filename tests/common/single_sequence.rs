//! Generation of one sequence over a dense KV store, one token per forward: the
//! second implementation the engine's batched, paged path is checked against (the
//! tests compare the server's and the engine's tokens and logprobs with it). It
//! shares the engine's sampler (`draw`) and finish rule (`check_sampled`), so what it
//! checks is the batching, the paged KV cache and the scheduling around them.

use treegrpo::engine::penalties::TokenHistory;
use treegrpo::engine::sampling::{draw, DrawOptions};
use treegrpo::engine::stop::check_sampled;
use treegrpo::engine::{
    EngineError, GenParams, Penalties, SampledToken, Sampling, SeqRng, StopReason,
};
use treegrpo::model::{
    BatchSeq, DenseKvStore, ForwardBatch, LogitsWanted, Model, ModelError, TokenId,
};

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Prompt token ids; not empty, every id below the vocabulary size, shorter than the
    /// context window.
    pub prompt: Vec<TokenId>,
    /// Most tokens to generate (0: none, the result is empty).
    pub max_new_tokens: usize,
    /// How each token is chosen.
    pub sampling: Sampling,
    /// Seed of the generation's RNG: the same request gives the same tokens.
    pub seed: u64,
    /// Tokens that end the generation (not included in the output).
    pub stop_tokens: Vec<TokenId>,
    /// Prompt tokens computed per forward; bounds activation memory on long prompts.
    pub prefill_chunk: usize,
    /// vLLM's penalties over the prompt and the output (none: [`Penalties::NONE`]).
    pub penalties: Penalties,
}

/// The generated tokens with their logprobs.
#[derive(Debug, Clone)]
pub struct SingleGeneration {
    /// The generated tokens with their logprobs, in order (a stop token is not included).
    pub tokens: Vec<SampledToken>,
    /// Why the generation ended.
    pub stop: StopReason,
}

/// Prefills the prompt, then decodes one token per forward until a stop condition.
/// A caller's mistake is a variant of its own, as through the batched engine:
/// [`EngineError::EmptyPrompt`], [`EngineError::BadToken`], and a prompt that fills the
/// context is `Model(ContextOverflow)`.
pub fn generate(model: &Model, req: &GenerateRequest) -> Result<SingleGeneration, EngineError> {
    let cfg = model.config();
    if req.prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    if let Some(&token) = req.prompt.iter().find(|&&t| t as usize >= cfg.vocab_size) {
        return Err(EngineError::BadToken {
            token,
            vocab: cfg.vocab_size,
        });
    }
    if req.prompt.len() >= cfg.max_position_embeddings {
        return Err(ModelError::ContextOverflow {
            tokens: req.prompt.len(),
            max: cfg.max_position_embeddings,
        }
        .into());
    }
    let mut kv = DenseKvStore::new(cfg.num_layers, cfg.kv_dim());
    let slot = kv.add_sequence();
    let mut rng = SeqRng::new(req.seed);
    let chunk = req.prefill_chunk.max(1);
    let mut logits = Vec::new();
    for (i, part) in req.prompt.chunks(chunk).enumerate() {
        let last = (i + 1) * chunk >= req.prompt.len();
        let out = model.forward(
            &ForwardBatch {
                seqs: vec![BatchSeq {
                    slot,
                    start: i * chunk,
                    tokens: part.to_vec(),
                    logits: if last {
                        LogitsWanted::Last
                    } else {
                        LogitsWanted::None
                    },
                }],
            },
            &mut kv,
        )?;
        if last {
            logits = out
                .into_iter()
                .next()
                .and_then(|s| s.rows.into_iter().next())
                .unwrap_or_default();
        }
    }
    let params = GenParams {
        sampling: req.sampling,
        stop_tokens: req.stop_tokens.clone(),
        penalties: req.penalties,
        ..GenParams::greedy(req.max_new_tokens)
    };
    let mut history = TokenHistory::new(req.prompt.iter().copied());
    let mut tokens: Vec<SampledToken> = Vec::new();
    let mut ids: Vec<TokenId> = Vec::new();
    let mut pos = req.prompt.len();
    if req.max_new_tokens == 0 {
        return Ok(SingleGeneration {
            tokens,
            stop: StopReason::MaxTokens,
        });
    }
    loop {
        let options = DrawOptions {
            penalties: &req.penalties,
            history: Some(&history),
            ..DrawOptions::PLAIN
        };
        let next = draw(&logits, &req.sampling, options, &mut rng).sampled;
        let verdict = check_sampled(
            &params,
            &ids,
            next.token,
            pos + 1,
            cfg.max_position_embeddings,
            |_| Ok(String::new()),
        )?;
        if verdict.keep {
            tokens.push(next);
            ids.push(next.token);
            history.push_output(next.token);
        }
        if let Some(stop) = verdict.stop {
            return Ok(SingleGeneration { tokens, stop });
        }
        let out = model.forward(
            &ForwardBatch {
                seqs: vec![BatchSeq {
                    slot,
                    start: pos,
                    tokens: vec![next.token],
                    logits: LogitsWanted::Last,
                }],
            },
            &mut kv,
        )?;
        pos += 1;
        logits = out
            .into_iter()
            .next()
            .and_then(|s| s.rows.into_iter().next())
            .unwrap_or_default();
    }
}
