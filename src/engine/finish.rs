//! Sampling a generation's next token from the logits of its last position, and
//! ending the generation (stop token, stop string, max tokens, full context).

use super::core::{EngineCore, Generation};
use super::error::EngineError;
use super::sampling::{sample, SampledToken};
use super::stop::{check_sampled, StopReason};
use crate::kv::SeqId;

impl EngineCore {
    /// Samples `seq`'s next token from `logits`, then either finishes the generation
    /// or queues the token to be fed.
    pub(super) fn sample_next(&mut self, seq: SeqId, logits: &[f32]) -> Result<(), EngineError> {
        let max_pos = self.model.model.config().max_position_embeddings;
        let cached = self.kv.seq_len(seq)?;
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(EngineError::UnknownSequence(seq))?;
        let Some(g) = s.generating.as_mut() else {
            return Ok(());
        };
        if g.tokens.len() >= g.params.max_new_tokens {
            return self.finish(seq, StopReason::MaxTokens);
        }
        let SampledToken { token, logprob } = sample(logits, &g.params.sampling, &mut g.rng);
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
            if g.stream {
                self.streamed.push((seq, SampledToken { token, logprob }));
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
            self.finished.push((
                seq,
                Ok(Generation {
                    tokens: g.tokens,
                    logprobs: g.logprobs,
                    stop: reason,
                    weight_version: self.weight_version,
                }),
            ));
        }
        Ok(())
    }
}
