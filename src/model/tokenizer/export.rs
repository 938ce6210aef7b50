//! A tokenizer written out as HF files (`tokenizer.json`, `tokenizer_config.json`), so
//! a checkpoint of a model loaded from GGUF is a complete HF directory.
//!
//! A GGUF byte-level BPE maps onto an HF BPE model with the same vocabulary and
//! merges; the pre-tokeniser becomes the HF pipeline that splits the same way:
//! `Digits(individual) + ByteLevel(regex)` for the GPT-2 family (SmolLM isolates
//! digits first), `Split(regex, isolated) + ByteLevel(no regex)` with an NFC
//! normaliser for Qwen2 and Llama 3. The checkpoint test checks that both encode the
//! default model's prompts to the same ids.

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::bpe::BpeTokenizer;
use super::{Backend, Tokenizer};
use crate::model::error::ModelError;

/// The GPT-2 split regex, which HF's `ByteLevel(use_regex = true)` applies itself.
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

fn export_err(source: tokenizers::Error) -> ModelError {
    ModelError::Tokenizer {
        context: "cannot write the tokenizer as tokenizer.json",
        source,
    }
}

fn bpe_to_hf(b: &BpeTokenizer) -> Result<tokenizers::Tokenizer, ModelError> {
    let vocab: Vocab = b
        .tokens()
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    // Merges whose parts or result are not tokens never fire in ours; HF rejects them.
    let merges: Vec<(String, String)> = b
        .merge_list()
        .iter()
        .filter_map(|m| m.split_once(' '))
        .filter(|(l, r)| {
            vocab.contains_key(*l)
                && vocab.contains_key(*r)
                && vocab.contains_key(&format!("{l}{r}"))
        })
        .map(|(l, r)| (l.to_string(), r.to_string()))
        .collect();
    let model = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(export_err)?;
    let mut tok = tokenizers::Tokenizer::new(model);
    let pre = b.pre_tokenizer();
    let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
    if pre.isolates_digits() {
        steps.push(Digits::new(true).into());
    }
    if pre.pattern() == GPT2_PATTERN {
        steps.push(ByteLevel::new(false, true, true).into());
    } else {
        let split = Split::new(
            SplitPattern::Regex(pre.pattern().to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(export_err)?;
        steps.push(split.into());
        steps.push(ByteLevel::new(false, false, false).into());
    }
    tok.with_pre_tokenizer(Some(Sequence::new(steps)));
    if pre.normalizes_nfc() {
        tok.with_normalizer(Some(NFC));
    }
    tok.with_decoder(Some(ByteLevel::default()));
    let added: Vec<AddedToken> = b
        .specials()
        .map(|(t, _)| AddedToken::from(t.to_string(), true))
        .collect();
    tok.add_special_tokens(&added);
    Ok(tok)
}

impl Tokenizer {
    /// This tokenizer as the text of an HF `tokenizer.json`.
    pub fn to_hf_json(&self) -> Result<String, ModelError> {
        match &self.backend {
            Backend::Hf(t) => t.to_string(false).map_err(export_err),
            Backend::Bpe(b) => bpe_to_hf(b)?.to_string(false).map_err(export_err),
        }
    }

    /// The `tokenizer_config.json` our HF loader reads back: BOS and EOS tokens,
    /// whether a BOS goes first, and the chat template.
    pub fn hf_config_json(&self, chat_template: Option<&str>) -> serde_json::Value {
        let mut c = serde_json::json!({
            "add_bos_token": self.add_bos,
            "tokenizer_class": "PreTrainedTokenizerFast",
        });
        if self.bos.is_some() {
            c["bos_token"] = self.bos_text().into();
        }
        if !self.eos.is_empty() {
            c["eos_token"] = self.eos_text().into();
        }
        if let Some(t) = chat_template {
            c["chat_template"] = t.into();
        }
        c
    }
}
