//! The engine on the default model: forks compute nothing twice and change nothing,
//! batches change nothing, and shared prompts are prefilled once.
//!
//! Tolerance: none. Every row's arithmetic is independent of the batch and of how the
//! prefix was chunked (our kernels compute each row in a fixed order), so a forked or
//! batched sequence must produce bit-identical logits and tokens.

mod common;

use std::sync::Arc;

use treegrpo::engine::{EngineConfig, EngineCore, GenParams, Generation, Sampling};
use treegrpo::kv::SeqId;
use treegrpo::model::{ChatMessage, LoadedModel};

fn model() -> Arc<LoadedModel> {
    Arc::new(LoadedModel::load(&common::default_model()).unwrap())
}

fn prompt(m: &LoadedModel, text: &str) -> Vec<u32> {
    m.chat_prompt(&[ChatMessage::new("user", text)]).unwrap()
}

fn core(m: &Arc<LoadedModel>, cfg: EngineConfig) -> EngineCore {
    EngineCore::new(m.clone(), cfg).unwrap()
}

fn finish(core: &mut EngineCore, seq: SeqId) -> Generation {
    core.run_until_idle().unwrap();
    let done = core.take_finished();
    let (_, result) = done
        .into_iter()
        .find(|(s, _)| *s == seq)
        .expect("generation finished");
    result.unwrap()
}

#[test]
fn fork_equals_fresh_prefill_inside_a_block_and_on_a_boundary() {
    let m = model();
    let full = prompt(&m, "Name three rivers in Europe and say which is longest.");
    for p in [16usize, 21, 32] {
        // Parent: prefill p tokens; fork; the child computes only the rest.
        let mut c = core(&m, EngineConfig::default());
        let parent = c.add_sequence(&full[..p]).unwrap();
        c.run_until_idle().unwrap();
        let child = c.fork(parent).unwrap();
        let forked = c.score(child, &full[p..]).unwrap();

        // Fresh: the whole prompt in one forward, in another engine (no cache shared).
        let mut f = core(&m, EngineConfig::default());
        let fresh_seq = f.add_sequence(&full[..1]).unwrap();
        f.run_until_idle().unwrap();
        let fresh = f.score(fresh_seq, &full[1..]).unwrap();
        let fresh_tail = &fresh[p - 1..];
        assert_eq!(forked.len(), fresh_tail.len());
        for (i, (a, b)) in forked.iter().zip(fresh_tail).enumerate() {
            assert!(a == b, "fork at {p}: logits differ at position {}", p + i);
        }

        // Greedy continuation from the fork equals the fresh one.
        c.generate(child, GenParams::greedy(16)).unwrap();
        let g1 = finish(&mut c, child);
        f.generate(fresh_seq, GenParams::greedy(16)).unwrap();
        let g2 = finish(&mut f, fresh_seq);
        assert_eq!(g1, g2, "fork at {p}");
        // The parent's prefix was never recomputed for the child.
        assert_eq!(c.stats().counters.prefilled as usize, full.len());
    }
}

/// The step keeps a prefilled sequence's last logits (copied out of the step's
/// reused logits block, from the row of its place in the batch): a generation started
/// later, on it or on a fork of it, samples its first token from them.
#[test]
fn a_sequence_prefilled_in_a_batch_keeps_its_logits_for_a_later_generation_and_its_forks() {
    let m = model();
    let p = prompt(&m, "Name three rivers in Europe and say which is longest.");
    let other = prompt(&m, "What is the capital of France? Answer in one word.");

    let mut a = core(&m, EngineConfig::default());
    // Second in the batch, so its row is not the block's first.
    a.add_sequence(&other).unwrap();
    let seq = a.add_sequence(&p).unwrap();
    a.run_until_idle().unwrap();
    let child = a.fork(seq).unwrap();
    a.generate(child, GenParams::greedy(8)).unwrap();
    let from_child = finish(&mut a, child);
    a.generate(seq, GenParams::greedy(8)).unwrap();
    let from_seq = finish(&mut a, seq);

    // The same prompt generated at once, in an engine of its own.
    let mut b = core(&m, EngineConfig::default());
    let fresh = b.add_sequence(&p).unwrap();
    b.generate(fresh, GenParams::greedy(8)).unwrap();
    let want = finish(&mut b, fresh);
    assert_eq!(from_seq, want);
    assert_eq!(from_child, want);
}

fn sampling(seed: u64) -> GenParams {
    GenParams {
        penalties: treegrpo::engine::Penalties::NONE,
        top_logprobs: 0,
        boost: None,
        sampling: Sampling::Random {
            min_p: None,
            temperature: 0.9,
            top_k: None,
            top_p: Some(0.95),
        },
        max_new_tokens: 24,
        min_tokens: 0,
        stop_tokens: Vec::new(),
        stop_strings: Vec::new(),
        seed: vec![seed],
    }
}

#[test]
fn a_seeded_sequence_samples_the_same_alone_and_in_a_batch_of_32() {
    let m = model();
    let probe = prompt(&m, "Write one sentence about autumn.");

    let mut alone = core(&m, EngineConfig::default());
    let s = alone.add_sequence(&probe).unwrap();
    alone.generate(s, sampling(42)).unwrap();
    let expected = finish(&mut alone, s);

    // 31 other sequences of different lengths, started at different steps, so the
    // probe's prefill and decodes share forwards with other prefills and decodes.
    let cfg = EngineConfig {
        max_batch_tokens: 96,
        ..EngineConfig::default()
    };
    let mut busy = core(&m, cfg);
    let topics = [
        "the sea",
        "mountains",
        "a cat",
        "rain",
        "bread",
        "trains",
        "chess",
        "snow",
    ];
    let mut others = Vec::new();
    for i in 0..12 {
        let p = prompt(
            &m,
            &format!("Tell me about {} in {} words.", topics[i % 8], 5 + i),
        );
        let o = busy.add_sequence(&p).unwrap();
        busy.generate(o, sampling(1000 + i as u64)).unwrap();
        others.push(o);
    }
    busy.step().unwrap();
    busy.step().unwrap();
    let s = busy.add_sequence(&probe).unwrap();
    busy.generate(s, sampling(42)).unwrap();
    for i in 12..31 {
        busy.step().unwrap();
        let p = prompt(&m, &format!("Describe {} briefly ({i}).", topics[i % 8]));
        let o = busy.add_sequence(&p).unwrap();
        busy.generate(o, sampling(1000 + i as u64)).unwrap();
        others.push(o);
    }
    busy.run_until_idle().unwrap();
    let done = busy.take_finished();
    assert_eq!(done.len(), 32, "every generation finished");
    let got = done.into_iter().find(|(q, _)| *q == s).unwrap().1.unwrap();
    assert_eq!(got, expected);
}

#[test]
fn m_sequences_forked_from_one_prompt_prefill_it_once() {
    let m = model();
    let p = prompt(&m, "What is the tallest mountain on Earth?");
    let mut c = core(&m, EngineConfig::default());
    let root = c.add_sequence(&p).unwrap();
    c.run_until_idle().unwrap();
    let trees: Vec<SeqId> = (0..4).map(|_| c.fork(root).unwrap()).collect();
    for (i, &t) in trees.iter().enumerate() {
        c.generate(
            t,
            GenParams {
                penalties: treegrpo::engine::Penalties::NONE,
                top_logprobs: 0,
                seed: vec![i as u64],
                ..sampling(0)
            },
        )
        .unwrap();
    }
    c.run_until_idle().unwrap();
    let counters = c.stats().counters;
    assert_eq!(
        counters.prefilled as usize,
        p.len(),
        "the prompt is prefilled once"
    );
    assert_eq!(counters.reused_fork as usize, 4 * p.len());
    assert_eq!(c.take_finished().len(), 4);
}

#[test]
fn sequences_added_later_reuse_the_cached_prompt_blocks() {
    let m = model();
    let p = prompt(&m, "Explain photosynthesis to a child in two sentences.");
    // Blocks smaller than the prompt, so there are whole blocks to reuse.
    let block = 16;
    let config = EngineConfig {
        block_size: block,
        ..EngineConfig::default()
    };
    let mut c = core(&m, config);
    let first = c.add_sequence(&p).unwrap();
    c.run_until_idle().unwrap();
    c.free(first).unwrap();
    let again = c.add_sequence(&p).unwrap();
    c.run_until_idle().unwrap();
    let counters = c.stats().counters;
    let full_blocks = p.len() / block * block;
    let cached = full_blocks.min(p.len() - 1);
    assert!(
        cached > 0,
        "the prompt ({} tokens) spans a whole block",
        p.len()
    );
    assert_eq!(counters.reused_prefix_cache as usize, cached);
    assert_eq!(counters.prefilled as usize, p.len() + (p.len() - cached));
    c.free(again).unwrap();
}

/// vLLM's `min_tokens`: the generation's stop tokens cannot be drawn before it has
/// that many, so a stop token the greedy choice would take first comes no earlier.
#[test]
fn min_tokens_keeps_the_stop_tokens_out_until_the_generation_has_that_many() {
    let m = model();
    let p = prompt(&m, "Name three rivers in Europe.");
    let mut c = core(&m, EngineConfig::default());
    let seq = c.add_sequence(&p).unwrap();
    c.generate(seq, GenParams::greedy(8)).unwrap();
    let free = finish(&mut c, seq);
    let first = free.tokens[0];

    // The greedy first token as a stop token ends the generation at once.
    let stopped = |min_tokens: usize, c: &mut EngineCore| {
        let seq = c.add_sequence(&p).unwrap();
        let params = GenParams {
            stop_tokens: vec![first],
            min_tokens,
            ..GenParams::greedy(8)
        };
        c.generate(seq, params).unwrap();
        finish(c, seq)
    };
    let at_once = stopped(0, &mut c);
    assert!(at_once.tokens.is_empty());
    assert_eq!(at_once.stop, treegrpo::engine::StopReason::StopToken);

    let held = stopped(5, &mut c);
    assert!(held.tokens.len() >= 5, "{:?}", held.tokens);
    assert!(!held.tokens[..5].contains(&first));
    // The masked first choice: its policy logprob is the model's, its behaviour
    // logprob is renormalised without the banned token (greedy: ≥ the policy's).
    assert!(held.behaviour_logprobs[0] >= held.logprobs[0]);

    // min_tokens above max_new_tokens is refused, named.
    let seq = c.add_sequence(&p).unwrap();
    let err = c
        .generate(
            seq,
            GenParams {
                min_tokens: 9,
                ..GenParams::greedy(8)
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("min_tokens"), "{err}");
}
