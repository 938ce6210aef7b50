//! Sampling a generation's next token from the logits of its last position, and
//! ending the generation (stop token, stop string, max tokens, full context).

use super::core::{EngineCore, Generation};
use super::error::EngineError;
use super::sampling::{sample, SampledToken};
use super::stop::{find_stop, StopReason};
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
        if g.params.stop_tokens.contains(&token) {
            return self.finish(seq, StopReason::StopToken);
        }
        g.tokens.push(token);
        g.logprobs.push(logprob);
        if !g.params.stop_strings.is_empty() {
            // A new match must end in the last token, and every token decodes to at
            // least one byte, so decoding the last (longest stop + 1) tokens suffices:
            // O(stop length) per sampled token instead of re-decoding the generation.
            let longest = g
                .params
                .stop_strings
                .iter()
                .map(String::len)
                .max()
                .unwrap_or(0);
            let window = &g.tokens[g.tokens.len().saturating_sub(longest + 1)..];
            let text = self.model.tokenizer.decode(window)?;
            let last = self.model.tokenizer.decode(&[token])?;
            if find_stop(&text, &g.params.stop_strings, last.len()).is_some() {
                s.push_sampled(token);
                return self.finish(seq, StopReason::StopString);
            }
        }
        let reached_max = g.tokens.len() >= g.params.max_new_tokens;
        s.push_sampled(token);
        if reached_max {
            return self.finish(seq, StopReason::MaxTokens);
        }
        if cached + s.pending.len() >= max_pos {
            return self.finish(seq, StopReason::ContextFull);
        }
        Ok(())
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
                }),
            ));
        }
        Ok(())
    }
}
