//! Seeded random operation sequences against the engine core on a tiny model, with a
//! KV pool small enough that sequences wait for room, cached blocks are evicted and
//! some sequences can never fit.
//!
//! After every operation: the KV layer's invariants hold, every live sequence's cached
//! tokens are a prefix of what the test knows it holds (prompt, appends, generated
//! tokens), and every finished generation is checked against a plain dense forward of
//! its context (each sampled token's logprob, and greedy picks the top logit). Every
//! `generate` that was accepted ends exactly once in `take_finished`, as `Ok` or as an
//! explicit `Err`. At the end, with everything freed and unpinned and the prefix cache
//! cleared, every block is free.

#[path = "../common/mod.rs"]
mod common;
mod harness;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::max_abs_diff;
use common::rng::Rng;
use common::tiny::{logits_all, Flavour, TinyModel};
use treegrpo::engine::{
    EngineConfig, EngineCore, EngineError, GenParams, Generation, Sampling, StopReason,
};
use treegrpo::kv::{PinId, SeqId};
use treegrpo::model::{LoadedModel, ModelError, TokenId};

/// The tiny llama written as a GGUF (f32 weights) and loaded the way the product loads.
fn tiny_model() -> Arc<LoadedModel> {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("tiny.gguf");
    TinyModel::new(Flavour::Llama, 11).write_gguf(&path);
    Arc::new(LoadedModel::load(&path).unwrap())
}

fn config(model: &LoadedModel, blocks: usize) -> EngineConfig {
    let block_size = 4;
    EngineConfig {
        kv_budget_bytes: blocks * block_size * model.model.config().kv_bytes_per_token(),
        block_size,
        max_batch_tokens: 16,
        max_batch_seqs: 8,
        ..EngineConfig::default()
    }
}

use harness::{run, Coverage};

/// Pools of 12 blocks (a sequence longer than 48 tokens never fits) and of 24 blocks
/// (everything fits alone; sequences wait for each other and evict cached blocks).
#[test]
fn random_engine_operations_keep_the_cache_consistent_and_lose_no_generation() {
    let model = tiny_model();
    assert_eq!(model.model.config().max_position_embeddings, 64);
    let mut total = Coverage::default();
    let runs = [
        (1, 12),
        (2, 24),
        (3, 12),
        (4, 32),
        (5, 16),
        (6, 48),
        (7, 20),
        (8, 64),
    ];
    for (seed, blocks) in runs {
        total.add(&run(&model, seed, blocks, 500));
    }
    eprintln!("total over {} runs: {total:?}", runs.len());
    // The runs reach the paths they are meant to.
    assert!(total.gen_ok >= 50 && total.gen_tokens >= 100, "{total:?}");
    assert!(total.stop_token > 0 && total.max_tokens > 0, "{total:?}");
    assert!(total.never_fits > 0 && total.overflow > 0, "{total:?}");
    assert!(
        total.context_full > 0 && total.prefill_errors > 0,
        "{total:?}"
    );
    assert!(
        total.busy > 0 && total.forks > 20 && total.pins > 10,
        "{total:?}"
    );
    assert!(total.unknown > 0, "{total:?}");
    assert!(total.evictions > 0 && total.cow_copies > 0, "{total:?}");
}

/// A generation whose sequence is freed before it finishes must still be reported
/// (as an error), or an async caller waiting for it would wait forever.
#[test]
fn freeing_a_generating_sequence_reports_its_generation() {
    let model = tiny_model();
    let mut core = EngineCore::new(model.clone(), config(&model, 32)).unwrap();
    let seq = core.add_sequence(&[5, 6, 7, 8, 9]).unwrap();
    core.generate(seq, GenParams::greedy(8)).unwrap();
    core.step().unwrap();
    core.free(seq).unwrap();
    core.run_until_idle().unwrap();
    let finished = core.take_finished();
    assert_eq!(
        finished.len(),
        1,
        "the generation of a freed sequence was dropped"
    );
    assert!(finished[0].1.is_err());
}

/// A token id outside the vocabulary is refused where it enters (add or append), so it
/// can never reach a forward and fail other sequences' batch.
#[test]
fn an_out_of_vocabulary_token_is_refused_and_others_go_on() {
    let model = tiny_model();
    let vocab = model.model.config().vocab_size as TokenId;
    let mut core = EngineCore::new(model.clone(), config(&model, 32)).unwrap();
    let good = core.add_sequence(&[5, 6, 7]).unwrap();
    assert!(matches!(
        core.add_sequence(&[5, vocab + 3]),
        Err(EngineError::BadToken { .. })
    ));
    assert!(matches!(
        core.append(good, &[vocab]),
        Err(EngineError::BadToken { .. })
    ));
    core.generate(good, GenParams::greedy(4)).unwrap();
    core.run_until_idle().unwrap();
    let finished = core.take_finished();
    assert_eq!(finished.len(), 1);
    assert!(finished[0].1.is_ok());
}

/// The same through the async handle: a `generate` whose sequence is freed meanwhile
/// must resolve (with an error), not wait forever.
#[tokio::test]
async fn engine_generate_resolves_when_its_sequence_is_freed() {
    let model = tiny_model();
    let engine = treegrpo::engine::Engine::start(model.clone(), config(&model, 32)).unwrap();
    let seq = engine.add_sequence(vec![5, 6, 7, 8, 9]).await.unwrap();
    // Both commands are sent in one poll, so the engine applies them back to back.
    let (generated, freed) = tokio::join!(
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            engine.generate(seq, GenParams::greedy(50))
        ),
        engine.free(seq)
    );
    freed.unwrap();
    let generated = generated.expect("generate never resolved");
    assert!(generated.is_err(), "{generated:?}");
}

/// `prefill` of tokens that cannot be computed (past the context window) reports an
/// error through `take_flushed`, not `Ok`.
#[test]
fn a_failed_prefill_reports_an_error() {
    let model = tiny_model();
    let max = model.model.config().max_position_embeddings;
    let mut core = EngineCore::new(model.clone(), config(&model, 32)).unwrap();
    let prompt: Vec<TokenId> = (0..max as TokenId - 4).map(|i| 3 + i % 200).collect();
    let seq = core.add_sequence(&prompt).unwrap();
    core.append(seq, &[5; 10]).unwrap();
    core.prefill(seq).unwrap();
    core.run_until_idle().unwrap();
    let flushed = core.take_flushed();
    assert_eq!(flushed.len(), 1);
    assert!(
        flushed[0].1.is_err(),
        "prefill past the context: {:?}",
        flushed[0].1
    );
}
