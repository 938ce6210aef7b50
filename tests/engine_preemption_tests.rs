//! Preemption by recompute on the engine core (issue 12), with a tiny model.
//!
//! The same seeded script of operations — adds (often sharing a prompt prefix), forks
//! kept as idle snapshots, appends, generations, prefills, single steps, frees — runs
//! on a pool far too small for all its sequences at once (each fits alone) and on a
//! pool large enough for everything. The script never depends on timing: it touches a
//! sequence only after a sync (`run_until_idle`) has delivered its last result. On
//! the small pool no sequence may fail, every generation must be bit-identical to the
//! large pool's, and at the end every block is free and every refcount zero.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::rng::Rng;
use common::tiny::{Flavour, TinyModel};
use treegrpo::engine::{
    Engine, EngineConfig, EngineCore, EngineError, GenParams, Generation, Sampling, SeqUsage,
};
use treegrpo::kv::SeqId;
use treegrpo::model::{KvSlot, LoadedModel, ModelError, TokenId};

/// The tiny llama with Q8_0 matrices: on our quantised kernel every row's arithmetic
/// is independent of the batch, so a recompute must be bit-identical. (Dense weights
/// go through candle's gemm, whose results move by ~1e-6 with the row count.)
fn tiny_model() -> Arc<LoadedModel> {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("tiny.gguf");
    TinyModel::new(Flavour::Llama, 11)
        .write_gguf_quantized(&path, candle_core::quantized::GgmlDType::Q8_0);
    Arc::new(LoadedModel::load(&path).unwrap())
}

const BLOCK: usize = 4;
/// Longest logical sequence the script builds (the model's context is 64).
const MAX_LEN: usize = 60;

fn config(model: &LoadedModel, blocks: usize) -> EngineConfig {
    EngineConfig {
        kv_budget_bytes: blocks * BLOCK * model.model.config().kv_bytes_per_token(),
        block_size: BLOCK,
        max_batch_tokens: 16,
        max_batch_seqs: 8,
        ..EngineConfig::default()
    }
}

/// A sequence as the script knows it.
struct Known {
    seq: SeqId,
    tokens: Vec<TokenId>,
    /// A generate or prefill was issued since the last sync.
    busy: bool,
}

/// Everything a run produced, to compare across pool sizes.
#[derive(Debug, PartialEq)]
struct Outcome {
    /// (op index of the `generate`, tokens, logprob bits, stop) in op order.
    generations: Vec<(usize, Vec<TokenId>, Vec<u32>, String)>,
    /// Logical tokens of every live sequence at every sync.
    syncs: Vec<Vec<Vec<TokenId>>>,
}

struct Run {
    core: EngineCore,
    vocab: usize,
    known: BTreeMap<usize, Known>,
    next_handle: usize,
    /// Generations in flight: sequence → op index.
    generating: BTreeMap<SeqId, usize>,
    out: Outcome,
    freed_usage: SeqUsage,
    /// Preemptions the generations report (each while it generated).
    generation_preemptions: u64,
}

impl Run {
    fn new(model: &Arc<LoadedModel>, blocks: usize) -> Self {
        let core = EngineCore::new(model.clone(), config(model, blocks)).unwrap();
        assert_eq!(core.kv().num_blocks(), blocks);
        Run {
            core,
            vocab: model.model.config().vocab_size,
            known: BTreeMap::new(),
            next_handle: 0,
            generating: BTreeMap::new(),
            out: Outcome {
                generations: Vec::new(),
                syncs: Vec::new(),
            },
            freed_usage: SeqUsage::default(),
            generation_preemptions: 0,
        }
    }

    fn idle(&self) -> Vec<usize> {
        self.known
            .iter()
            .filter(|(_, k)| !k.busy)
            .map(|(&h, _)| h)
            .collect()
    }

    fn pick_idle(&self, rng: &mut Rng) -> Option<usize> {
        let idle = self.idle();
        (!idle.is_empty()).then(|| idle[rng.below(idle.len())])
    }

    fn insert(&mut self, seq: SeqId, tokens: Vec<TokenId>) {
        self.known.insert(
            self.next_handle,
            Known {
                seq,
                tokens,
                busy: false,
            },
        );
        self.next_handle += 1;
    }

    fn apply(&mut self, op: usize, rng: &mut Rng, bases: &[Vec<TokenId>]) {
        match rng.below(100) {
            0..=11 if self.known.len() < 8 => {
                let base = &bases[rng.below(bases.len())];
                let mut prompt = base[..rng.range(0, base.len())].to_vec();
                let extra = rng.range(usize::from(prompt.is_empty()), 8);
                prompt.extend(rng.tokens(extra, self.vocab));
                let seq = self.core.add_sequence(&prompt).unwrap();
                self.insert(seq, prompt);
            }
            // A fork kept idle: a tree node's snapshot.
            12..=23 => {
                let Some(h) = self.pick_idle(rng) else { return };
                if self.known.len() >= 10 {
                    return;
                }
                let parent = &self.known[&h];
                let child = self.core.fork(parent.seq).unwrap();
                let tokens = parent.tokens.clone();
                self.insert(child, tokens);
            }
            24..=35 => {
                let Some(h) = self.pick_idle(rng) else { return };
                let n = rng.range(1, 6);
                if self.known[&h].tokens.len() + n > MAX_LEN - 4 {
                    return;
                }
                let tokens = rng.tokens(n, self.vocab);
                let k = self.known.get_mut(&h).unwrap();
                self.core.append(k.seq, &tokens).unwrap();
                k.tokens.extend(tokens);
            }
            36..=55 => {
                let Some(h) = self.pick_idle(rng) else { return };
                let room = MAX_LEN - self.known[&h].tokens.len();
                if room == 0 {
                    return; // a generation needs room for at least one token
                }
                let sampling = if rng.below(2) == 0 {
                    Sampling::Greedy
                } else {
                    Sampling::Random {
                        min_p: None,
                        temperature: 1.0,
                        top_k: None,
                        top_p: None,
                    }
                };
                let params = GenParams {
                    penalties: treegrpo::engine::Penalties::NONE,
                    top_logprobs: 0,
                    boost: None,
                    sampling,
                    max_new_tokens: rng.range(1, 10).min(room),
                    min_tokens: 0,
                    stop_tokens: Vec::new(),
                    stop_strings: Vec::new(),
                    seed: vec![rng.next()],
                };
                let k = self.known.get_mut(&h).unwrap();
                self.core.generate(k.seq, params).unwrap();
                k.busy = true;
                self.generating.insert(k.seq, op);
            }
            56..=62 => {
                let Some(h) = self.pick_idle(rng) else { return };
                let k = self.known.get_mut(&h).unwrap();
                self.core.prefill(k.seq).unwrap();
                k.busy = true;
            }
            63..=79 => {
                self.core.step().unwrap();
            }
            80..=89 => self.sync(),
            _ => {
                let Some(h) = self.pick_idle(rng) else { return };
                let k = self.known.remove(&h).unwrap();
                let usage = self.core.free(k.seq).unwrap();
                self.freed_usage.add(&usage);
            }
        }
        self.core.kv().check_invariants().unwrap();
        self.collect();
    }

    /// Takes the finished work. Nothing fails: every sequence fits the pool alone.
    fn collect(&mut self) {
        for (seq, r) in self.core.take_finished() {
            let op = self
                .generating
                .remove(&seq)
                .expect("a generation nobody started");
            let g: Generation = r.unwrap_or_else(|e| panic!("{seq:?} failed: {e}"));
            let h = self.known.values_mut().find(|k| k.seq == seq).unwrap();
            h.tokens.extend(&g.tokens);
            let bits = g.logprobs.iter().map(|l| l.to_bits()).collect();
            self.generation_preemptions += u64::from(g.preemptions);
            self.out
                .generations
                .push((op, g.tokens, bits, format!("{:?}", g.stop)));
        }
        for (seq, r) in self.core.take_flushed() {
            r.unwrap_or_else(|e| panic!("prefill of {seq:?} failed: {e}"));
        }
    }

    fn sync(&mut self) {
        self.core.run_until_idle().unwrap();
        for k in self.known.values_mut() {
            k.busy = false;
        }
        let mut live = Vec::new();
        for k in self.known.values() {
            live.push(self.core.tokens(k.seq).unwrap());
        }
        self.out.syncs.push(live);
    }

    /// The script's end: everything computed, compared, freed; the pool empty.
    fn finish(mut self) -> (Outcome, treegrpo::engine::EngineCounters, u64) {
        self.sync();
        self.collect();
        assert!(self.generating.is_empty(), "generations never reported");
        for k in self.known.values() {
            // A generation's last sampled token stays pending until the sequence goes
            // on, so it is not computed yet.
            let computed = self.core.tokens(k.seq).unwrap();
            assert!(
                k.tokens.starts_with(&computed) && k.tokens.len() - computed.len() <= 1,
                "{:?}: computed {computed:?}, the script knows {:?}",
                k.seq,
                k.tokens
            );
        }
        let handles: Vec<usize> = self.known.keys().copied().collect();
        for h in handles {
            let k = self.known.remove(&h).unwrap();
            let usage = self.core.free(k.seq).unwrap();
            self.freed_usage.add(&usage);
            self.core.kv().check_invariants().unwrap();
        }
        self.core.clear_prefix_cache();
        self.core.kv().check_invariants().unwrap();
        let st = self.core.kv().stats();
        assert_eq!(
            (st.in_use, st.cached, st.free),
            (0, 0, st.num_blocks),
            "{st:?}"
        );
        assert!(self.core.kv().references().iter().all(|&r| r == 0));
        // Finishing order depends on the schedule; what each generation produced
        // must not.
        self.out.generations.sort_by_key(|g| g.0);
        let c = self.core.stats().counters;
        // Every computed row is attributed to exactly one sequence.
        let u = &self.freed_usage;
        assert_eq!(
            (
                u.prefilled,
                u.decoded,
                u.recomputed_preempted,
                u.preemptions
            ),
            (
                c.prefilled,
                c.decoded,
                c.recomputed_preempted,
                c.preemptions
            )
        );
        // Preemptions during a generation are a subset of all preemptions.
        assert!(self.generation_preemptions <= c.preemptions);
        (self.out, c, self.generation_preemptions)
    }
}

fn run(
    model: &Arc<LoadedModel>,
    seed: u64,
    blocks: usize,
    ops: usize,
) -> (Outcome, treegrpo::engine::EngineCounters, u64) {
    let mut rng = Rng::new(seed);
    let mut run = Run::new(model, blocks);
    let bases: Vec<Vec<TokenId>> = (0..2).map(|_| rng.tokens(16, run.vocab)).collect();
    for op in 0..ops {
        run.apply(op, &mut rng, &bases);
    }
    run.finish()
}

/// Must-show 3 of issue 12. The small pool holds 20 blocks (80 positions) where the
/// script keeps up to ten sequences of up to 60 tokens alive.
#[test]
fn a_pool_too_small_for_all_preempts_fails_nothing_and_changes_no_result() {
    let model = tiny_model();
    assert_eq!(model.model.config().max_position_embeddings, 64);
    let (mut preemptions, mut recomputed, mut generations) = (0, 0, 0);
    let mut during_generation = 0;
    for seed in 1..=6 {
        let (small, cs, small_during) = run(&model, seed, 20, 400);
        let (large, cl, large_during) = run(&model, seed, 400, 400);
        assert_eq!(cl.preemptions, 0, "the large pool preempted");
        assert_eq!(large_during, 0);
        during_generation += small_during;
        assert!(
            small == large,
            "seed {seed}: results differ between a pool of 20 and of 400 blocks"
        );
        eprintln!("seed {seed}: {cs:?}");
        preemptions += cs.preemptions;
        recomputed += cs.recomputed_preempted;
        generations += small.generations.len();
    }
    // The runs reach what they are meant to test.
    assert!(generations > 100, "{generations} generations");
    assert!(preemptions > 20, "{preemptions} preemptions");
    assert!(recomputed > 100, "{recomputed} tokens recomputed");
    // Generations report theirs (verl's `num_preempted`).
    assert!(during_generation > 0, "no generation saw its preemption");
}

/// Every error a caller can cause, through the public `Engine` handle, matched on its
/// variant. A sequence that can never fit fails alone: the other one finishes.
#[tokio::test]
async fn caller_errors_are_typed_and_a_sequence_that_never_fits_fails_alone() {
    let model = tiny_model();
    let vocab = model.model.config().vocab_size as TokenId;
    let max = model.model.config().max_position_embeddings;
    // 8 blocks of 4: 32 positions.
    let engine = Engine::start(model.clone(), config(&model, 8)).unwrap();
    let unknown = SeqId::from_slot(KvSlot::new(999));
    assert!(matches!(
        engine.fork(unknown).await,
        Err(EngineError::UnknownSequence(s)) if s == unknown
    ));
    assert!(matches!(
        engine.add_sequence(vec![5, vocab]).await,
        Err(EngineError::BadToken { token, .. }) if token == vocab
    ));
    assert!(matches!(
        engine.add_sequence(Vec::new()).await,
        Err(EngineError::EmptyPrompt)
    ));
    let too_long: Vec<TokenId> = (0..max as TokenId).map(|i| 3 + i % 50).collect();
    assert!(matches!(
        engine.add_sequence(too_long).await,
        Err(EngineError::Model(ModelError::ContextOverflow { .. }))
    ));
    // 40 tokens need 10 blocks of a pool of 8.
    let long: Vec<TokenId> = (0..40).map(|i| 3 + i % 50).collect();
    let big = engine.add_sequence(long).await.unwrap();
    let small = engine.add_sequence(vec![5, 6, 7]).await.unwrap();
    let (big_r, small_r) = tokio::join!(
        engine.prefill(big),
        engine.generate(small, GenParams::greedy(6))
    );
    match big_r {
        Err(EngineError::NeverFits {
            seq,
            tokens,
            needed,
            total,
            ..
        }) => {
            assert_eq!((seq, tokens, needed, total), (big, 40, 10, 8));
        }
        other => panic!("{other:?}"),
    }
    let msg = engine.prefill(big).await;
    assert!(
        msg.is_ok(),
        "a failed sequence keeps what it computed: {msg:?}"
    );
    assert_eq!(small_r.unwrap().tokens.len(), 6);
    engine.free(big).await.unwrap();
    engine.free(small).await.unwrap();
}
