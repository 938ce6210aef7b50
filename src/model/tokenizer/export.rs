//! A tokenizer written out as HF files (`tokenizer.json`, `tokenizer_config.json`), so
//! a checkpoint of a model loaded from GGUF is a complete HF directory. Every tokenizer
//! is already a `tokenizers` pipeline (see `gguf.rs`), so `tokenizer.json` is its
//! serialisation; the checkpoint test checks that the file encodes the default model's
//! prompts to the same ids.

use super::Tokenizer;
use crate::model::error::ModelError;

fn export_err(source: tokenizers::Error) -> ModelError {
    ModelError::Tokenizer {
        context: "cannot write the tokenizer as tokenizer.json",
        source,
    }
}

impl Tokenizer {
    /// This tokenizer as the text of an HF `tokenizer.json`.
    pub fn to_hf_json(&self) -> Result<String, ModelError> {
        self.parsing.to_string(false).map_err(export_err)
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
