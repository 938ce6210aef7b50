//! Sampling a generation's next token from the logits of its last position, and
//! ending the generation (stop token, stop string, max tokens, full context).

use std::sync::Mutex;

use super::core::EngineCore;
use super::error::EngineError;
use super::rng::SeqRng;
use super::sampling::{draw, DrawOptions, Drawn};
use super::sequence::{GenState, Generation};
use super::stop::{check_sampled, StopReason};
use crate::kv::SeqId;
use crate::model::team;

/// Below this many sequences to sample in one step, the engine thread samples them
/// itself (waking the team costs more than one draw).
const TEAM_SAMPLING_MIN: usize = 2;

impl EngineCore {
    /// Samples `seq`'s next token from `logits`, then either finishes the generation
    /// or queues the token to be fed.
    pub(super) fn sample_next(&mut self, seq: SeqId, logits: &[f32]) -> Result<(), EngineError> {
        self.sample_all(&[(seq, logits)])
    }

    /// [`Self::sample_next`] for several sequences, in order. The draws (a pass or two
    /// over the vocabulary each, the step's largest serial work) run on the forward's
    /// team, a share of the sequences per member: each sequence draws from its own
    /// random stream, so every token is the one a draw alone would give.
    pub(super) fn sample_all(&mut self, due: &[(SeqId, &[f32])]) -> Result<(), EngineError> {
        // Who draws: a generation below its token limit (its stream, copied out).
        let mut draws: Vec<(usize, &GenState, Mutex<SeqRng>)> = Vec::new();
        for (i, (seq, _)) in due.iter().enumerate() {
            let s = self
                .seqs
                .get(seq)
                .ok_or(EngineError::UnknownSequence(*seq))?;
            if let Some(g) = &s.generating {
                if g.tokens.len() < g.params.max_new_tokens {
                    draws.push((i, g, Mutex::new(g.rng.clone())));
                }
            }
        }
        let drawn: Vec<Mutex<Option<Drawn>>> = draws.iter().map(|_| Mutex::new(None)).collect();
        let draw_one = |k: usize| {
            let (i, g, rng) = &draws[k];
            let mut rng = rng.lock().unwrap_or_else(|e| e.into_inner());
            let options = DrawOptions {
                penalties: &g.params.penalties,
                history: g.history.as_ref(),
                top_logprobs: g.params.top_logprobs,
                draw_from: g.boost_now(),
                banned: g.banned_now(),
            };
            let token = draw(due[*i].1, &g.params.sampling, options, &mut rng);
            *drawn[k].lock().unwrap_or_else(|e| e.into_inner()) = Some(token);
        };
        if draws.len() >= TEAM_SAMPLING_MIN {
            team::global().run(|m| m.share(draws.len()).for_each(draw_one));
        } else {
            (0..draws.len()).for_each(draw_one);
        }
        // Owned results (the draws borrow the sequences, which applying them changes).
        let results: Vec<(usize, SeqRng, Drawn)> = draws
            .into_iter()
            .zip(drawn)
            .map(|((i, _, rng), token)| {
                let rng = rng.into_inner().unwrap_or_else(|e| e.into_inner());
                let token = token.into_inner().unwrap_or_else(|e| e.into_inner());
                // Every draw ran to the end (a panicking one re-raised in `run`).
                (i, rng, token.expect("a draw that did not finish"))
            })
            .collect();
        let mut results = results.into_iter().peekable();
        for (i, &(seq, _)) in due.iter().enumerate() {
            match results.next_if(|(at, ..)| *at == i) {
                Some((_, rng, drawn)) => self.take_sampled(seq, drawn, rng)?,
                None => {
                    let generating = self.seqs.get(&seq).is_some_and(|s| s.generating.is_some());
                    if generating {
                        self.finish(seq, StopReason::MaxTokens)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Applies a token drawn for `seq` (with its random stream after the draw): either
    /// finishes the generation or queues the token to be fed.
    fn take_sampled(&mut self, seq: SeqId, drawn: Drawn, rng: SeqRng) -> Result<(), EngineError> {
        let max_pos = self.model.model.config().max_position_embeddings;
        let cached = self.kv.seq_len(seq)?;
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(EngineError::UnknownSequence(seq))?;
        let Some(g) = s.generating.as_mut() else {
            return Ok(());
        };
        g.rng = rng;
        let Drawn {
            sampled,
            behaviour_logprob,
            top,
        } = drawn;
        let (token, logprob) = (sampled.token, sampled.logprob);
        self.counters.sampled += 1;
        // The sequence's length with the new token: what is cached plus what is
        // pending (the token joins the pending ones).
        let total_after = cached + s.pending.len() + 1;
        let tokenizer = &self.model.tokenizer;
        let verdict = check_sampled(&g.params, &g.tokens, token, total_after, max_pos, |t| {
            tokenizer.decode(t)
        })?;
        if verdict.keep {
            g.tokens.push(token);
            g.logprobs.push(logprob);
            g.behaviour_logprobs.push(behaviour_logprob);
            if g.params.top_logprobs > 0 {
                g.top_logprobs.push(top);
            }
            if let Some(h) = g.history.as_mut() {
                h.push_output(token);
            }
            if g.stream {
                self.streamed.push((seq, sampled));
            }
            s.push_sampled(token);
        }
        match verdict.stop {
            Some(reason) => self.finish(seq, reason),
            None => Ok(()),
        }
    }

    /// Ends `seq`'s generation. Its last sampled token stays pending: it is fed (and
    /// its KV computed) only if the sequence continues, so nothing is computed for a
    /// branch that ends here.
    fn finish(&mut self, seq: SeqId, reason: StopReason) -> Result<(), EngineError> {
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(EngineError::UnknownSequence(seq))?;
        s.runnable = false;
        if let Some(g) = s.generating.take() {
            let boosted = g.params.boost.map_or(0, |b| b.tokens.min(g.tokens.len()));
            self.finished.push((
                seq,
                Ok(Generation {
                    tokens: g.tokens,
                    logprobs: g.logprobs,
                    behaviour_logprobs: g.behaviour_logprobs,
                    boosted,
                    stop: reason,
                    weight_version: self.weight_version,
                    top_logprobs: g.top_logprobs,
                    preemptions: g.preemptions,
                }),
            ));
        }
        Ok(())
    }
}

impl GenState {
    /// The tokens the next draw may not choose: the stop tokens while fewer than
    /// `min_tokens` are generated.
    fn banned_now(&self) -> &[crate::model::TokenId] {
        if self.tokens.len() < self.params.min_tokens {
            &self.params.stop_tokens
        } else {
            &[]
        }
    }

    /// What the next token is drawn from when it is not the generation's own
    /// sampling: the boost, while the kept tokens are fewer than it covers.
    fn boost_now(&self) -> Option<crate::engine::Sampling> {
        self.params
            .boost
            .filter(|b| self.tokens.len() < b.tokens)
            .map(|b| b.sampling)
    }
}
