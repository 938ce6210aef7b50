//! The harness's checks: each finished generation and score against a dense forward,
//! the KV layer's invariants and every live sequence's cached tokens after each
//! operation, and, at the end, every block free again.

use super::super::*;
use super::{Harness, Outstanding};

impl Harness {
    pub(super) fn check_generation(&mut self, seq: SeqId, o: &Outstanding, g: &Generation) {
        let p = &o.params;
        let n = g.tokens.len();
        self.cov.gen_ok += 1;
        self.cov.gen_tokens += n;
        assert_eq!(g.logprobs.len(), n, "{seq:?}");
        assert!(n <= p.max_new_tokens, "{seq:?}: {n} > {}", p.max_new_tokens);
        assert!(g.tokens.iter().all(|t| !p.stop_tokens.contains(t)));
        match g.stop {
            StopReason::MaxTokens => {
                assert_eq!(n, p.max_new_tokens, "{seq:?}");
                self.cov.max_tokens += 1;
            }
            StopReason::StopToken => {
                assert!(!p.stop_tokens.is_empty() && n < p.max_new_tokens);
                self.cov.stop_token += 1;
            }
            StopReason::ContextFull => {
                assert!(
                    o.context.len() + n >= self.max_pos,
                    "{seq:?}: early ContextFull"
                );
                self.cov.context_full += 1;
            }
            StopReason::StopString => panic!("{seq:?}: no stop strings were given"),
        }
        if n == 0 {
            return;
        }
        // Token i was sampled from the logits after context ++ tokens[..i].
        let mut all = o.context.clone();
        all.extend(&g.tokens[..n - 1]);
        let rows = logits_all(&self.model, &all);
        let temperature = match p.sampling {
            Sampling::Greedy => 1.0,
            Sampling::Random { temperature, .. } => temperature as f64,
        };
        for (i, (&tok, &lp)) in g.tokens.iter().zip(&g.logprobs).enumerate() {
            let row = &rows[o.context.len() - 1 + i];
            let scaled: Vec<f64> = row.iter().map(|&l| l as f64 / temperature).collect();
            let max = scaled.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + scaled.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
            let want = scaled[tok as usize] - lse;
            assert!(
                (lp as f64 - want).abs() < 2e-3,
                "{seq:?} token {i} ({tok}): logprob {lp}, a dense forward gives {want}"
            );
            if p.sampling == Sampling::Greedy {
                assert!(
                    scaled[tok as usize] >= max - 1e-3,
                    "{seq:?} token {i}: greedy picked {tok}, not the top logit"
                );
            }
        }
    }

    pub(super) fn check_score(
        &mut self,
        seq: SeqId,
        tokens: &[TokenId],
        r: Result<Vec<Vec<f32>>, EngineError>,
    ) {
        let known = &self.shadow[&seq];
        let cached = self.core.tokens(seq).unwrap().len();
        if known.len() > cached {
            // Pending tokens (a generation's last token, appended tokens) come first.
            assert!(matches!(r, Err(EngineError::Busy(s)) if s == seq), "{r:?}");
            self.cov.busy += 1;
            return;
        }
        if known.len() + tokens.len() > self.max_pos {
            assert!(r.is_err(), "{seq:?}: scored past the context window");
            self.cov.score_err += 1;
            return;
        }
        let rows = match r {
            Ok(rows) => rows,
            Err(EngineError::Kv(treegrpo::kv::KvError::OutOfBlocks { .. })) => {
                self.cov.score_err += 1;
                return;
            }
            Err(e) => panic!("{seq:?}: score failed: {e}"),
        };
        assert_eq!(rows.len(), tokens.len());
        let mut all = known.clone();
        all.extend(tokens);
        if !tokens.is_empty() {
            let want = logits_all(&self.model, &all);
            for (i, row) in rows.iter().enumerate() {
                let dense = &want[known.len() + i];
                let diff = max_abs_diff(row, dense);
                assert!(diff < 1e-3, "{seq:?}: scored row {i} differs by {diff}");
            }
        }
        self.cov.scores += 1;
        self.shadow.insert(seq, all);
    }

    /// The checks run after every operation.
    pub(super) fn check(&self) {
        self.core.kv().check_invariants().unwrap();
        let st = self.core.kv().stats();
        assert_eq!(st.in_use + st.cached + st.free, st.num_blocks, "{st:?}");
        for (&seq, tokens) in &self.shadow {
            let cached = self.core.tokens(seq).unwrap();
            // A running generation's tokens are cached before they are reported.
            let n = if self.generating.contains_key(&seq) {
                cached.len().min(tokens.len())
            } else {
                cached.len()
            };
            assert!(
                n <= tokens.len() && cached[..n] == tokens[..n],
                "{seq:?}: cached {cached:?} is not a prefix of {tokens:?}"
            );
        }
        for seq in &self.freed {
            assert!(
                !self.core.kv().contains(*seq),
                "{seq:?} freed but in the cache"
            );
        }
    }

    /// Drains the work, frees and unpins everything and clears the prefix cache.
    pub(super) fn finish(&mut self) {
        self.core.run_until_idle().unwrap();
        self.collect();
        self.collect_flushed();
        self.check();
        assert!(self.flushing.is_empty(), "prefills never reported");
        assert!(
            self.generating.is_empty(),
            "generations never reported: {:?}",
            self.generating.keys().collect::<Vec<_>>()
        );
        for seq in self.live() {
            self.core.free(seq).unwrap();
            self.shadow.remove(&seq);
            self.check();
        }
        for pin in std::mem::take(&mut self.pins) {
            self.core.unpin(pin).unwrap();
            self.check();
        }
        assert!(self.core.take_finished().is_empty());
        self.core.clear_prefix_cache();
        self.core.kv().check_invariants().unwrap();
        let st = self.core.stats().kv;
        assert_eq!(st.in_use, 0, "{st:?}");
        assert_eq!(st.cached, 0, "{st:?}");
        assert_eq!(st.pinned, 0, "{st:?}");
        assert_eq!(st.free, st.num_blocks, "{st:?}");
        assert!(self.core.kv().sequence_ids().is_empty());
        assert!(self.core.kv().pin_ids().is_empty());
    }
}
