//! The GRPO chain workload on mistral.rs: G independent agent chains per prompt, every
//! prompt × chain at once, each chain stepping through the same [`Environment`] our
//! rollouts use (`grow_branch` in `src/rollout/sampler.rs` is the loop this mirrors).
//!
//! What both engines share: the GGUF file, the prompt *token ids* (our chat template
//! rendered by [`LoadedModel::chat_prompt`], sent as a raw-token completion so mistral.rs
//! applies no template of its own), the sampling settings, the per-step token limit,
//! the stop strings ([`Environment::stop_strings`]) and the tools ([`Environment::step`]).
//!
//! Per chain: generate a step; hand its text to `env.step`; if the episode goes on,
//! append the step and the observation and send the *whole sequence so far* as the next
//! request. mistral.rs's prefix cache (sequence level on CPU) finds the previous turn's
//! finished sequence and computes only the new tokens.
//!
//! Differences mistral.rs's API imposes, and what we do about them:
//! - **No token ids come back**, only text. The next request's ids are the previous
//!   request's ids, then our tokenizer's encoding of the step text and of the
//!   observation. Where the model sampled a non-canonical tokenisation, the prefix cache
//!   matches up to that point and mistral.rs recomputes the rest (a small cost to it).
//!   Token counts in [`PeerRunSummary`] are *our* tokenizer's counts of the texts.
//! - **Stop strings**: mistral.rs cuts the text *before* the stop string, trims leading
//!   whitespace and does not say which stop string (or EOS) ended it. We ask for
//!   per-token logprobs (with no top-k lists, so they cost next to nothing) only to read
//!   each generated token's text back: from them we restore the leading whitespace and
//!   the stop string, so `env.step` sees what our engine would give it (the text up to
//!   and including the first stop string). mistral.rs notices a stop string one token
//!   late (it checks the text before adding the new token), so it decodes one token
//!   more per stopped step than our engine; `peer_completion_tokens` counts those.
//! - **Shared prompts**: mistral.rs shares KV between requests only through its prefix
//!   cache, which holds *finished* sequences, so G chains started together would each
//!   prefill the prompt. With [`ChainWorkload::warm_prefixes`] (default on) we first
//!   run the prompts' common prefix (the system prompt), then each prompt, as one-token
//!   requests, so the chains find them cached: the closest mistral.rs comes to our
//!   engine's "prefill once, fork G". The warm-up requests stop two tokens short of the
//!   prompt, because mistral.rs does not reuse a cached sequence that covers the whole
//!   new prompt. Warm-up time is part of `wall_seconds`; model loading is not.
//! - **Seeds**: mistral.rs 0.8.1 has no per-request seed. One RNG (Isaac64, seeded with
//!   the constant 0 when the engine starts) serves every request in the order the
//!   scheduler samples them, so a run is reproducible only if the requests arrive and
//!   are batched in the same order, which concurrent chains with tool calls do not
//!   guarantee. [`ChainWorkload::seed`] is therefore not passed to mistral.rs; greedy
//!   sampling is deterministic.
//! - **Scheduling**: on CPU mistral.rs has no paged attention, and its default
//!   scheduler batches only sequences of *equal length*; the others wait. When the
//!   running ones finish, it restarts every waiting sequence as a prompt, which (read
//!   from its 0.8.1 source) resets and recomputes its KV cache. Agent chains are never
//!   the same length for long, so with many sequences allowed (`max_num_seqs` 64) the
//!   workload of the smoke test (2 prompts × 2 chains, 32-token steps) took 496 s,
//!   against 61 s with one sequence at a time. Batching buys mistral.rs almost nothing
//!   on this CPU anyway (candle 0.10's Q4_1 matmul, which it uses, is a scalar dot
//!   product per row and column: 29.7 tok/s decode at batch 1, 32.5 at batch 2), so
//!   [`ChainWorkload::new`] sets `max_num_seqs` to 1: requests are still all sent at
//!   once and queue inside mistral.rs.
//! - On CPU mistral.rs's prefix cache never evicts (it counts only device caches), so
//!   memory grows with every finished request of the run.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use serde::Serialize;
use tokio::sync::mpsc::Sender;
use tokio::task::JoinSet;

use super::{
    complete, load_peer_model, sampling_params, sender, PeerDType, PeerError, PeerModelConfig,
};
use crate::engine::stop::find_stop;
use crate::engine::Sampling;
use crate::env::{run_agent_loop, Environment, Episode, ModelStep, QaSample, StepDone, StepModel};
use crate::model::{LoadedModel, TokenId};

/// The chain workload's shape and settings.
#[derive(Debug, Clone, Serialize)]
pub struct ChainWorkload {
    /// G: independent chains per prompt.
    pub chains: usize,
    /// How each step is sampled (handed to mistral.rs as its sampling parameters).
    pub sampling: Sampling,
    /// Most tokens per agent step.
    pub max_step_tokens: usize,
    /// Recorded only: mistral.rs takes no per-request seed (see the module docs).
    pub seed: u64,
    /// Most sequences mistral.rs's scheduler runs at once (see the module docs for why
    /// 1 is its best setting for chains on CPU).
    pub max_num_seqs: usize,
    /// Prefill the shared system prompt, then each prompt, before the chains start,
    /// so the chains find them in the prefix cache (see the module docs).
    pub warm_prefixes: bool,
    /// What mistral.rs computes in (f32 by default, as our engine does).
    pub dtype: PeerDType,
}

impl ChainWorkload {
    /// G chains, one sequence at a time inside mistral.rs (its fastest setting for
    /// this workload on CPU, see the module docs), warmed prefixes, f32 activations.
    pub fn new(chains: usize, sampling: Sampling, max_step_tokens: usize, seed: u64) -> Self {
        ChainWorkload {
            chains,
            sampling,
            max_step_tokens,
            seed,
            max_num_seqs: 1,
            warm_prefixes: true,
            dtype: PeerDType::F32,
        }
    }
}

/// Figures of one peer run. Token counts are our tokenizer's counts of the texts
/// (mistral.rs returns no token ids); `peer_*` are mistral.rs's own counters.
#[derive(Debug, Clone, Serialize)]
pub struct PeerRunSummary {
    /// Prompts (samples) run.
    pub prompts: usize,
    /// Finished chains (G per prompt).
    pub rollouts: usize,
    /// Mean reward of the chains, scored by our environment (0 when there are none).
    pub mean_reward: f64,
    /// Σ over rollouts of the chat prompt's length.
    pub prompt_tokens: u64,
    /// Σ over rollouts of the observations' lengths (tool results, feedback).
    pub observation_tokens: u64,
    /// Σ over rollouts of the model steps' lengths (up to and including the stop string).
    pub generated_tokens: u64,
    /// Search / calculator actions.
    pub tool_calls: u64,
    /// From the first request (warm-up included) to the last chain's end.
    pub wall_seconds: f64,
    /// `rollouts / wall_seconds`.
    pub rollouts_per_second: f64,
    /// Of `wall_seconds`: the prefix warm-up.
    pub warmup_seconds: f64,
    /// Loading the GGUF into mistral.rs (not part of `wall_seconds`).
    pub load_seconds: f64,
    /// Completion requests sent (warm-up included).
    pub requests: u64,
    /// mistral.rs's count of prompt tokens sent, over all requests: every turn re-sends
    /// the whole sequence so far (the prefix cache decides how much is computed).
    pub peer_prompt_tokens: u64,
    /// mistral.rs's count of generated tokens, including the token it decodes past each
    /// stop string and the warm-up tokens.
    pub peer_completion_tokens: u64,
    /// The workload that was run.
    pub workload: ChainWorkload,
}

/// Runs `workload.chains` chains per sample on mistral.rs (see the module docs).
///
/// `ours` supplies the chat template and tokenizer (prompts and counting); mistral.rs
/// loads `model_path` itself, which should be the file `ours` was loaded from. Needs a
/// multi-threaded tokio runtime.
pub async fn run_mistralrs_chains(
    model_path: &std::path::Path,
    ours: Arc<LoadedModel>,
    env: Arc<dyn Environment>,
    samples: Vec<QaSample>,
    workload: ChainWorkload,
) -> Result<PeerRunSummary, PeerError> {
    let prompts = checked_prompts(&ours, env.as_ref(), &samples, &workload)?;

    let t_load = Instant::now();
    let engine = load_peer_model(
        model_path,
        PeerModelConfig {
            max_num_seqs: workload.max_num_seqs,
            prefix_cache: true,
            dtype: workload.dtype,
            disable_eos_stop: false,
        },
    )
    .await?;
    let load_seconds = t_load.elapsed().as_secs_f64();
    let tx = sender(&engine)?;

    let t0 = Instant::now();
    let mut counters = Counters::default();
    if workload.warm_prefixes {
        warm_prefixes(&tx, &prompts, &mut counters).await?;
    }
    let warmup_seconds = t0.elapsed().as_secs_f64();

    let stops = env.stop_strings();
    let peer_stops = peer_stop_strings(&ours, &stops)?;
    let ctx = Arc::new(ChainContext {
        tx,
        ours,
        stops,
        peer_stops,
        env,
        workload: workload.clone(),
    });
    let (rewards, totals) = run_all_chains(&ctx, &samples, &prompts, workload.chains).await?;
    let wall_seconds = t0.elapsed().as_secs_f64();
    drop(engine);

    let rollouts = rewards.len();
    counters.requests += totals.counters.requests;
    counters.prompt_tokens += totals.counters.prompt_tokens;
    counters.completion_tokens += totals.counters.completion_tokens;
    Ok(PeerRunSummary {
        prompts: samples.len(),
        rollouts,
        mean_reward: if rollouts == 0 {
            0.0
        } else {
            rewards.iter().sum::<f64>() / rollouts as f64
        },
        prompt_tokens: totals.prompt_tokens,
        observation_tokens: totals.observation_tokens,
        generated_tokens: totals.generated_tokens,
        tool_calls: totals.tool_calls,
        wall_seconds,
        rollouts_per_second: rollouts as f64 / wall_seconds.max(1e-9),
        warmup_seconds,
        load_seconds,
        requests: counters.requests,
        peer_prompt_tokens: counters.prompt_tokens,
        peer_completion_tokens: counters.completion_tokens,
        workload,
    })
}

/// Checks the workload and the samples, then renders every sample's chat prompt as
/// token ids; errors before mistral.rs is loaded, in the order the checks are listed.
fn checked_prompts(
    ours: &LoadedModel,
    env: &dyn Environment,
    samples: &[QaSample],
    workload: &ChainWorkload,
) -> Result<Vec<Vec<TokenId>>, PeerError> {
    if workload.chains == 0 {
        return Err(PeerError::Invalid("chains must be at least 1".into()));
    }
    if workload.max_step_tokens == 0 {
        return Err(PeerError::Invalid(
            "max_step_tokens must be at least 1".into(),
        ));
    }
    if samples.is_empty() {
        return Err(PeerError::Invalid("no samples".into()));
    }
    let prompts: Vec<Vec<TokenId>> = samples
        .iter()
        .map(|q| Ok(ours.chat_prompt(env.start(q)?.prompt())?))
        .collect::<Result<_, PeerError>>()?;
    if prompts.iter().any(|p| p.is_empty()) {
        return Err(PeerError::Invalid("a prompt has no tokens".into()));
    }
    Ok(prompts)
}

/// The stop strings sent to mistral.rs: the environment's `stops`, then the texts of
/// our EOS tokens not already among them.
///
/// mistral.rs stops at the EOS tokens *it* finds (GGUF metadata, chat template);
/// ours also stops at common end-of-turn markers. Sent as stop strings, the ones
/// that are single tokens become stop tokens there, so both engines stop alike.
fn peer_stop_strings(ours: &LoadedModel, stops: &[String]) -> Result<Vec<String>, PeerError> {
    let mut peer_stops = stops.to_vec();
    for &id in ours.tokenizer.eos_ids() {
        let t = ours.tokenizer.decode(&[id])?;
        if !t.is_empty() && !peer_stops.contains(&t) {
            peer_stops.push(t);
        }
    }
    Ok(peer_stops)
}

/// Spawns `chains` chains per prompt at once and waits for them all: the rewards in
/// the order the chains finished, and their summed figures. On the first failed
/// chain the rest are aborted and that first error is returned.
async fn run_all_chains(
    ctx: &Arc<ChainContext>,
    samples: &[QaSample],
    prompts: &[Vec<TokenId>],
    chains: usize,
) -> Result<(Vec<f64>, ChainTotals), PeerError> {
    let mut jobs = JoinSet::new();
    for (sample, prompt) in samples.iter().zip(prompts) {
        for _ in 0..chains {
            let ctx = ctx.clone();
            let sample = sample.clone();
            let prompt = prompt.clone();
            jobs.spawn(async move { run_chain(&ctx, &sample, prompt).await });
        }
    }
    let mut rewards = Vec::new();
    let mut totals = ChainTotals::default();
    let mut first_err = None;
    while let Some(joined) = jobs.join_next().await {
        let result = joined.map_err(PeerError::Task).and_then(|r| r);
        match result {
            Ok(c) => {
                rewards.push(c.reward);
                totals.add(&c);
            }
            Err(e) => {
                if first_err.is_none() {
                    first_err = Some(e);
                    jobs.abort_all();
                }
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    Ok((rewards, totals))
}

/// mistral.rs's own counters, summed over requests.
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    requests: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
}

impl Counters {
    fn add(&mut self, c: &super::Completion) {
        self.requests += 1;
        self.prompt_tokens += c.prompt_tokens as u64;
        self.completion_tokens += c.completion_tokens as u64;
    }
}

struct ChainContext {
    tx: Sender<mistralrs::Request>,
    ours: Arc<LoadedModel>,
    env: Arc<dyn Environment>,
    /// The environment's stop strings (what a step ends at).
    stops: Vec<String>,
    /// Sent to mistral.rs: `stops` plus our EOS tokens' texts.
    peer_stops: Vec<String>,
    workload: ChainWorkload,
}

/// One finished chain.
struct ChainResult {
    reward: f64,
    prompt_tokens: u64,
    observation_tokens: u64,
    generated_tokens: u64,
    tool_calls: u64,
    counters: Counters,
}

#[derive(Default)]
struct ChainTotals {
    prompt_tokens: u64,
    observation_tokens: u64,
    generated_tokens: u64,
    tool_calls: u64,
    counters: Counters,
}

impl ChainTotals {
    fn add(&mut self, c: &ChainResult) {
        self.prompt_tokens += c.prompt_tokens;
        self.observation_tokens += c.observation_tokens;
        self.generated_tokens += c.generated_tokens;
        self.tool_calls += c.tool_calls;
        self.counters.requests += c.counters.requests;
        self.counters.prompt_tokens += c.counters.prompt_tokens;
        self.counters.completion_tokens += c.counters.completion_tokens;
    }
}

/// mistral.rs as the agent loop's model: each step is one request whose prompt is the
/// chain's token ids so far; a non-final step's text and observation join the ids.
struct PeerChain<'a> {
    ctx: &'a ChainContext,
    params: mistralrs::SamplingParams,
    ids: Vec<TokenId>,
    result: ChainResult,
}

#[async_trait]
impl StepModel for PeerChain<'_> {
    type Error = PeerError;

    async fn step(&mut self, _index: usize) -> Result<ModelStep, PeerError> {
        let ctx = self.ctx;
        let c = complete(&ctx.tx, &self.ids, self.params.clone(), true, None).await?;
        self.result.counters.add(&c);
        let text = step_text(&c.text, &c.finish_reason, &c.token_texts, &ctx.stops);
        let tokens = ctx.ours.tokenizer.encode(&text, true)?;
        self.result.generated_tokens += tokens.len() as u64;
        // mistral.rs reports log10 logprobs of its own tokens, not ours: none here.
        Ok(ModelStep {
            tokens,
            logprobs: Vec::new(),
            behaviour_logprobs: Vec::new(),
            boosted: 0,
            text,
        })
    }

    async fn observe(&mut self, observation: &str) -> Result<Vec<TokenId>, PeerError> {
        let ids = self.ctx.ours.tokenizer.encode(observation, false)?;
        self.result.observation_tokens += ids.len() as u64;
        Ok(ids)
    }

    async fn step_done(&mut self, done: StepDone, _episode: &Episode) -> Result<(), PeerError> {
        if done.tool_call {
            self.result.tool_calls += 1;
        }
        if !done.outcome.done {
            self.ids.extend_from_slice(&done.step.tokens);
            self.ids.extend_from_slice(&done.observation);
        }
        Ok(())
    }
}

/// One chain through the shared agent loop (our `grow_branch` without trees).
async fn run_chain(
    ctx: &ChainContext,
    sample: &QaSample,
    prompt: Vec<TokenId>,
) -> Result<ChainResult, PeerError> {
    let params = sampling_params(
        &ctx.workload.sampling,
        ctx.workload.max_step_tokens,
        &ctx.peer_stops,
    );
    let mut episode = ctx.env.start(sample)?;
    let mut chain = PeerChain {
        ctx,
        params,
        result: ChainResult {
            reward: 0.0,
            prompt_tokens: prompt.len() as u64,
            observation_tokens: 0,
            generated_tokens: 0,
            tool_calls: 0,
            counters: Counters::default(),
        },
        ids: prompt,
    };
    run_agent_loop(ctx.env.as_ref(), &mut episode, &mut chain, 0).await?;
    let mut result = chain.result;
    result.reward = ctx.env.score(&episode).reward;
    Ok(result)
}

/// Puts the prompts' common prefix, then every prompt, into mistral.rs's prefix cache
/// with one-token greedy requests (see the module docs for why two tokens short).
async fn warm_prefixes(
    tx: &Sender<mistralrs::Request>,
    prompts: &[Vec<TokenId>],
    counters: &mut Counters,
) -> Result<(), PeerError> {
    let params = sampling_params(&Sampling::Greedy, 1, &[]);
    let short = |p: &[TokenId]| -> Option<Vec<TokenId>> {
        (p.len() > 2).then(|| p[..p.len() - 2].to_vec())
    };
    let shared_len = prompts.iter().skip(1).fold(prompts[0].len(), |n, p| {
        common_prefix_len(&prompts[0][..n], p)
    });
    if prompts.len() > 1 {
        if let Some(ids) = short(&prompts[0][..shared_len]) {
            counters.add(&complete(tx, &ids, params.clone(), false, None).await?);
        }
    }
    let mut jobs = JoinSet::new();
    let mut seen = std::collections::HashSet::new();
    for p in prompts {
        if let Some(ids) = short(p) {
            if seen.insert(ids.clone()) {
                let tx = tx.clone();
                let params = params.clone();
                jobs.spawn(async move { complete(&tx, &ids, params, false, None).await });
            }
        }
    }
    while let Some(joined) = jobs.join_next().await {
        let c = joined.map_err(PeerError::Task)??;
        counters.add(&c);
    }
    Ok(())
}

fn common_prefix_len(a: &[TokenId], b: &[TokenId]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Rebuilds the step text our engine would have produced from mistral.rs's answer: the
/// leading whitespace it trimmed and the stop string it cut are restored from the
/// generated tokens' texts, then the text ends at the first stop string (as ours does;
/// mistral.rs may have run past it when the token limit came first).
pub fn step_text(
    text: &str,
    finish_reason: &str,
    token_texts: &[String],
    stops: &[String],
) -> String {
    let raw: String = token_texts.concat();
    let body = raw.trim_start();
    let lead = &raw[..raw.len() - body.len()];
    let mut out = String::with_capacity(lead.len() + text.len() + 16);
    if !text.starts_with(char::is_whitespace) {
        out.push_str(lead);
    }
    out.push_str(text);
    let has_stop = |s: &str| find_stop(s, stops, s.len()).is_some();
    if finish_reason == "stop" && !has_stop(&out) {
        // The stop string right after the text, else (token texts decoded one by one
        // can differ from the text, e.g. split UTF-8) the first one in the tokens.
        let after = body
            .strip_prefix(text)
            .and_then(|rest| {
                stops
                    .iter()
                    .find(|s| !s.is_empty() && rest.starts_with(s.as_str()))
            })
            .or_else(|| {
                stops
                    .iter()
                    .filter(|s| !s.is_empty())
                    .filter_map(|s| body.find(s.as_str()).map(|i| (i, s)))
                    .min_by_key(|(i, _)| *i)
                    .map(|(_, s)| s)
            });
        if let Some(s) = after {
            out.push_str(s);
        }
    }
    if let Some(end) = find_stop(&out, stops, out.len()) {
        out.truncate(end);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::step_text;

    fn stops() -> Vec<String> {
        vec!["</search>".into(), "</answer>".into()]
    }

    fn toks(parts: &[&str]) -> Vec<String> {
        parts.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn restores_stop_string_and_leading_whitespace() {
        let t = toks(&["\n", "<search>", " x", "</", "search>", " more"]);
        assert_eq!(
            step_text("<search> x", "stop", &t, &stops()),
            "\n<search> x</search>"
        );
    }

    #[test]
    fn eos_appends_nothing() {
        let t = toks(&["<answer>", " y", "</answer>", "<|im_end|>"]);
        // EOS right after a completed stop string: the text already holds it.
        assert_eq!(
            step_text("<answer> y</answer>", "stop", &t, &stops()),
            "<answer> y</answer>"
        );
        let t = toks(&["hello"]);
        assert_eq!(step_text("hello", "stop", &t, &stops()), "hello");
    }

    #[test]
    fn length_cut_at_first_stop() {
        let t = toks(&["<answer>", "a", "</answer>", " tail"]);
        assert_eq!(
            step_text("<answer>a</answer> tail", "length", &t, &stops()),
            "<answer>a</answer>"
        );
    }
}
