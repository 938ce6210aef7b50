//! The tokenizer a GGUF file stores, built as a `tokenizers::Tokenizer` in memory.
//!
//! A GGUF byte-level BPE (`tokenizer.ggml.model = gpt2`) is a vocabulary, ranked merges
//! and token types, plus the name of a pre-tokenisation scheme. It maps onto an HF BPE
//! model with the same vocabulary and merges; the scheme becomes the HF pipeline that
//! splits the same way: `Digits(individual) + ByteLevel(regex)` for the GPT-2 family
//! (SmolLM isolates digits first), `Split(regex, isolated) + ByteLevel(no regex)` for
//! Qwen2 and Llama 3, with an NFC normaliser for Qwen2. Control and user-defined tokens
//! become special added tokens, matched before the split.
//!
//! Why `tokenizers` rather than a merge loop of our own: its merges run off a priority
//! queue (O(n log n) in a piece's length, where a rescan per merge is quadratic and a
//! one-million-letter word took hours), it is what HF models already use, and it can
//! encode special-token text as plain text (`set_encode_special_tokens`), which is how
//! untrusted text is kept from closing a turn. `tests/tokenizer_oracle_tests.rs` keeps
//! the merge loop this replaced as the oracle: both give the same ids on the tasks'
//! data, the chat templates and the test texts, for each scheme.

use std::collections::HashSet;

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::pretokenize::PreTokenizer;
use crate::model::TokenId;

/// Builds the tokenizer. `merges` are `"left right"` strings in rank order; `specials`
/// are the ids of the control and user-defined tokens. The error names what is wrong.
pub fn build(
    tokens: &[String],
    merges: &[String],
    specials: &[TokenId],
    pre: &PreTokenizer,
) -> Result<tokenizers::Tokenizer, String> {
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let mut pairs: Vec<(String, String)> = Vec::with_capacity(merges.len());
    let mut seen: HashSet<(&str, &str)> = HashSet::with_capacity(merges.len());
    for (rank, m) in merges.iter().enumerate() {
        let Some((left, right)) = m.split_once(' ') else {
            return Err(format!("merge {rank} ('{m}') is not two tokens"));
        };
        // A merge whose parts or result are not in the vocabulary can never fire (HF's
        // builder rejects it); a repeated pair keeps its first, lowest rank.
        let fires = vocab.contains_key(left)
            && vocab.contains_key(right)
            && vocab.contains_key(&format!("{left}{right}"));
        if fires && seen.insert((left, right)) {
            pairs.push((left.to_string(), right.to_string()));
        }
    }
    let model = BPE::builder()
        .vocab_and_merges(vocab, pairs)
        .build()
        .map_err(|e| format!("the vocabulary and merges do not make a BPE model: {e}"))?;
    let mut tok = tokenizers::Tokenizer::new(model);
    let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
    if pre.isolates_digits() {
        steps.push(Digits::new(true).into());
    }
    if pre.is_gpt2_pattern() {
        steps.push(ByteLevel::new(false, true, true).into());
    } else {
        let split = Split::new(
            SplitPattern::Regex(pre.pattern().to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| format!("pre-tokenizer '{}': {e}", pre.name()))?;
        steps.push(split.into());
        steps.push(ByteLevel::new(false, false, false).into());
    }
    tok.with_pre_tokenizer(Some(Sequence::new(steps)));
    if pre.normalizes_nfc() {
        tok.with_normalizer(Some(NFC));
    }
    tok.with_decoder(Some(ByteLevel::default()));
    // Longest-first matching is `tokenizers`' own rule for added tokens, as it was ours.
    let mut added: Vec<AddedToken> = Vec::with_capacity(specials.len());
    let mut special_texts: HashSet<&str> = HashSet::new();
    for &id in specials {
        let Some(text) = tokens.get(id as usize).filter(|t| !t.is_empty()) else {
            continue;
        };
        if special_texts.insert(text) {
            added.push(AddedToken::from(text.clone(), true));
        }
    }
    tok.add_special_tokens(&added);
    Ok(tok)
}
