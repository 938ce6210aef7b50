//! Swapping the served weights: nothing computed under the old weights is used after
//! the swap (cached prefixes are recomputed, live sequences recompute their KV), every
//! generation names the weights it came from, a generation in flight finishes on the
//! old weights while commands sent after the swap run on the new ones, and weights
//! load from a checkpoint directory as `treegrpo train` writes it.
//!
//! Oracle: a fresh engine started on the new weights. Every row's arithmetic is fixed,
//! so after a swap the engine must give bit-identically what the fresh one gives.
//! The "new weights" are the default model's served dense in bf16: the same shape,
//! other values (rounded), so their logits differ from the Q4 ones.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use treegrpo::engine::{Engine, EngineConfig, EngineCore, EngineError, GenParams, Generation};
use treegrpo::kv::SeqId;
use treegrpo::model::kernels::WeightFormat;
use treegrpo::model::{ChatMessage, LoadedModel, Model};

struct Fixture {
    old: Arc<LoadedModel>,
    new_weights: Arc<Model>,
    /// The bf16 weights as a model of their own (the oracle's engine).
    new: Arc<LoadedModel>,
}

fn fixture() -> Fixture {
    let old = Arc::new(LoadedModel::load(&common::default_model()).unwrap());
    let new = LoadedModel::load(&common::default_model())
        .unwrap()
        .with_dense_weights(WeightFormat::Bf16)
        .unwrap();
    Fixture {
        new_weights: new.model.clone(),
        new: Arc::new(new),
        old,
    }
}

fn prompt(m: &LoadedModel, text: &str) -> Vec<u32> {
    m.chat_prompt(&[ChatMessage::new("user", text)]).unwrap()
}

fn finish(core: &mut EngineCore, seq: SeqId) -> Generation {
    core.run_until_idle().unwrap();
    core.take_finished()
        .into_iter()
        .find(|(s, _)| *s == seq)
        .expect("generation finished")
        .1
        .unwrap()
}

/// Greedy 12 tokens of `tokens` on a fresh engine over `m`.
fn fresh_generation(m: &Arc<LoadedModel>, tokens: &[u32]) -> Generation {
    let mut core = EngineCore::new(m.clone(), EngineConfig::default()).unwrap();
    let seq = core.add_sequence(tokens).unwrap();
    core.generate(seq, GenParams::greedy(12)).unwrap();
    finish(&mut core, seq)
}

#[test]
fn a_prefix_cached_before_a_swap_is_recomputed_and_results_name_the_new_version() {
    let f = fixture();
    let p = prompt(&f.old, "Which river flows through Vienna?");
    // Blocks smaller than the prompt, so some are cached whole.
    let config = EngineConfig {
        block_size: 16,
        ..EngineConfig::default()
    };
    let mut core = EngineCore::new(f.old.clone(), config).unwrap();
    assert_eq!(core.weight_version(), 0);

    // Cache the prompt's full blocks under the old weights, then free the sequence.
    let first = core.add_sequence(&p).unwrap();
    core.generate(first, GenParams::greedy(12)).unwrap();
    let old_gen = finish(&mut core, first);
    assert_eq!(old_gen.weight_version, 0);
    core.free(first).unwrap();
    // Without a swap, the same prompt reuses its cached blocks.
    let again = core.add_sequence(&p).unwrap();
    let reused_before = core.stats().counters.reused_prefix_cache;
    assert!(reused_before >= 16, "the prompt's blocks were cached");
    core.free(again).unwrap();

    let version = core.swap_weights(f.new_weights.clone()).unwrap();
    assert_eq!(version, 1);
    assert_eq!(core.stats().weight_version, 1);
    assert_eq!(core.stats().counters.weight_swaps, 1);
    assert_eq!(
        core.kv().stats().cached,
        0,
        "stale cached blocks were freed"
    );

    let before = core.stats().counters;
    let seq = core.add_sequence(&p).unwrap();
    core.generate(seq, GenParams::greedy(12)).unwrap();
    let new_gen = finish(&mut core, seq);
    let after = core.stats().counters;
    assert_eq!(
        after.reused_prefix_cache, before.reused_prefix_cache,
        "no stale prefix reused"
    );
    assert_eq!(
        after.prefilled - before.prefilled,
        p.len() as u64,
        "the whole prompt is prefilled again"
    );
    assert_eq!(new_gen.weight_version, 1);
    let oracle = fresh_generation(&f.new, &p);
    assert_eq!(new_gen.tokens, oracle.tokens);
    assert_eq!(
        new_gen.logprobs, oracle.logprobs,
        "bit-identical to a fresh engine"
    );
    assert_ne!(
        old_gen.logprobs, new_gen.logprobs,
        "the new weights do change the result"
    );
    core.free(seq).unwrap();
    core.kv().check_invariants().unwrap();
}

#[test]
fn a_live_sequence_and_its_forks_recompute_their_kv_under_the_new_weights() {
    let f = fixture();
    let p = prompt(&f.old, "Name a large city in Japan.");
    let mut core = EngineCore::new(f.old.clone(), EngineConfig::default()).unwrap();
    let parent = core.add_sequence(&p).unwrap();
    core.run_until_idle().unwrap();
    let fork = core.fork(parent).unwrap();
    core.swap_weights(f.new_weights.clone()).unwrap();
    assert_eq!(core.stats().counters.stale_drops, 2);

    let before = core.stats().counters.recomputed_preempted;
    core.generate(fork, GenParams::greedy(12)).unwrap();
    let forked = finish(&mut core, fork);
    assert!(
        core.stats().counters.recomputed_preempted > before,
        "the fork's stale KV was recomputed"
    );
    core.generate(parent, GenParams::greedy(12)).unwrap();
    let parent_gen = finish(&mut core, parent);

    let oracle = fresh_generation(&f.new, &p);
    for g in [&forked, &parent_gen] {
        assert_eq!(g.weight_version, 1);
        assert_eq!(g.tokens, oracle.tokens);
        assert_eq!(g.logprobs, oracle.logprobs);
    }
    core.free(fork).unwrap();
    core.free(parent).unwrap();
    core.kv().check_invariants().unwrap();
    assert_eq!(core.kv().stats().in_use, 0, "every block back");
}

#[test]
fn a_swap_is_refused_while_a_generation_runs_or_a_pin_holds_kv() {
    let f = fixture();
    let p = prompt(&f.old, "Say hello.");
    let mut core = EngineCore::new(f.old.clone(), EngineConfig::default()).unwrap();
    let seq = core.add_sequence(&p).unwrap();
    core.generate(seq, GenParams::greedy(4)).unwrap();
    assert!(matches!(
        core.swap_weights(f.new_weights.clone()),
        Err(EngineError::SwapInFlight)
    ));
    finish(&mut core, seq);
    let pin = core.pin(seq).unwrap();
    assert!(matches!(
        core.swap_weights(f.new_weights.clone()),
        Err(EngineError::SwapWithPins { pins: 1 })
    ));
    core.unpin(pin).unwrap();
    assert_eq!(core.weight_version(), 0, "refused swaps change nothing");
    core.swap_weights(f.new_weights.clone()).unwrap();
    assert_eq!(core.weight_version(), 1);
}

#[test]
fn weights_of_another_shape_are_refused() {
    let f = fixture();
    let tiny_dir = tempfile::tempdir().unwrap();
    let tiny = common::tiny::TinyModel::new(common::tiny::Flavour::Llama, 7);
    tiny.write_hf(tiny_dir.path(), candle_core::DType::F32, 1);
    let other = LoadedModel::load(tiny_dir.path()).unwrap();
    let mut core = EngineCore::new(f.old.clone(), EngineConfig::default()).unwrap();
    let err = core.swap_weights(other.model.clone()).unwrap_err();
    assert!(matches!(err, EngineError::WeightShape { .. }), "{err}");
    assert_eq!(core.weight_version(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_load_from_a_checkpoint_directory() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let params =
        treegrpo::train::Params::from_model(&f.old.model, candle_core::DType::F32).unwrap();
    treegrpo::train::save_checkpoint(
        &ck,
        &params,
        treegrpo::train::CheckpointExtras {
            tokenizer: &f.old.tokenizer,
            chat_template: f.old.chat_template.as_ref(),
            optimizer: None,
            loop_state: None,
        },
    )
    .unwrap();
    let p = prompt(&f.old, "Which river flows through Vienna?");
    let engine = Engine::start(f.old.clone(), EngineConfig::default()).unwrap();
    assert_eq!(engine.load_weights_from(&ck).await.unwrap(), 1);
    let seq = engine.add_sequence(p.clone()).await.unwrap();
    let got = engine.generate(seq, GenParams::greedy(12)).await.unwrap();
    assert_eq!(got.weight_version, 1);
    let fresh = Arc::new(LoadedModel::load(&ck).unwrap());
    assert_eq!(got.logprobs, fresh_generation(&fresh, &p).logprobs);
    // A file that is not a model fails the call and changes nothing.
    let err = engine.load_weights_from(&dir.path().join("missing")).await;
    assert!(matches!(err, Err(EngineError::Model(_))), "{err:?}");
    assert_eq!(engine.stats().await.unwrap().weight_version, 1);
}

/// `f`, polled once (an engine call sends its command on its first poll).
async fn sent<F: Future + Unpin>(mut f: F) -> F {
    std::future::poll_fn(|cx| {
        let _ = Pin::new(&mut f).poll(cx);
        Poll::Ready(())
    })
    .await;
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_handle_a_generation_in_flight_finishes_on_the_old_weights() {
    let f = fixture();
    let p = prompt(&f.old, "Count from one to ten.");
    let engine = Engine::start(f.old.clone(), EngineConfig::default()).unwrap();
    let running = engine.add_sequence(p.clone()).await.unwrap();
    let later = engine.add_sequence(p.clone()).await.unwrap();
    // Sent in this order on one channel (each future is polled once, which sends its
    // command): the generation starts, the swap waits for it, and the second
    // generation, sent after the swap, runs on the new weights.
    let old_gen = sent(Box::pin(engine.generate(running, GenParams::greedy(24)))).await;
    let version = sent(Box::pin(engine.load_weights(f.new_weights.clone()))).await;
    let new_gen = sent(Box::pin(engine.generate(later, GenParams::greedy(12)))).await;
    let (old_gen, version, new_gen) = (
        old_gen.await.unwrap(),
        version.await.unwrap(),
        new_gen.await.unwrap(),
    );
    assert_eq!(version, 1);
    assert_eq!(old_gen.weight_version, 0);
    assert_eq!(new_gen.weight_version, 1);
    let mut old_oracle = EngineCore::new(f.old.clone(), EngineConfig::default()).unwrap();
    let s = old_oracle.add_sequence(&p).unwrap();
    old_oracle.generate(s, GenParams::greedy(24)).unwrap();
    assert_eq!(old_gen.logprobs, finish(&mut old_oracle, s).logprobs);
    assert_eq!(new_gen.logprobs, fresh_generation(&f.new, &p).logprobs);
    assert_eq!(engine.stats().await.unwrap().weight_version, 1);
}
