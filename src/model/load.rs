//! Picks the loader from the path: a `.gguf` file or an HF directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::chat::{ChatMessage, ChatTemplate};
use super::error::ModelError;
use super::forward::Model;
use super::kernels::WeightFormat;
use super::tokenizer::Tokenizer;
use super::TokenId;

/// A model ready to run: shared weights, tokenizer, chat template.
#[derive(Debug)]
pub struct LoadedModel {
    /// The network and its weights, shared with the engines that serve it.
    pub model: Arc<Model>,
    /// The model's tokenizer.
    pub tokenizer: Tokenizer,
    /// The model's chat template; `None` if it has none ([`LoadedModel::chat_prompt`] then
    /// fails with `NoChatTemplate`).
    pub chat_template: Option<ChatTemplate>,
    /// The `.gguf` file or HF directory it was loaded from.
    pub source: PathBuf,
}

impl LoadedModel {
    /// Loads a `.gguf` file or an HF directory.
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        if !path.exists() {
            return Err(ModelError::io(
                path,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or directory"),
            ));
        }
        let (model, tokenizer, chat_template) = if path.is_dir() {
            let m = super::safetensors::load(path)?;
            (m.model, m.tokenizer, m.chat_template)
        } else {
            let m = super::gguf::load(path)?;
            (m.model, m.tokenizer, m.chat_template)
        };
        if tokenizer.vocab_size() > model.config().vocab_size {
            return Err(ModelError::Config {
                path: path.to_path_buf(),
                msg: format!(
                    "tokenizer has {} tokens but the model's vocabulary is {}",
                    tokenizer.vocab_size(),
                    model.config().vocab_size
                ),
            });
        }
        Ok(LoadedModel {
            model: Arc::new(model),
            tokenizer,
            chat_template,
            source: path.to_path_buf(),
        })
    }

    /// The same model with every linear layer held dense in `format` (`F32`: exactly
    /// the values the quantised kernels multiply by, so logits are unchanged; `Bf16` /
    /// `F16`: rounded). What the engine serves once a trainer's dense weights replace
    /// the file's, and how dense decode speed is measured on any model.
    pub fn with_dense_weights(mut self, format: WeightFormat) -> Result<Self, ModelError> {
        self.model = Arc::new(self.model.densified(format)?);
        Ok(self)
    }

    /// The same model served at `precision` (see [`super::Precision`]).
    ///
    /// A model already served at `precision` (a loaded model is exact) is kept as it
    /// is, not copied: the copy is 200 MB of fresh memory for the default model.
    pub fn with_precision(mut self, precision: super::Precision) -> Result<Self, ModelError> {
        if self.model.serves_at(precision) {
            return Ok(self);
        }
        self.model = Arc::new(self.model.at_precision(precision)?);
        Ok(self)
    }

    /// Renders `messages` with the chat template and tokenises the result, ready for
    /// the assistant's reply.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<TokenId>, ModelError> {
        let tmpl = self
            .chat_template
            .as_ref()
            .ok_or_else(|| ModelError::NoChatTemplate {
                path: self.source.clone(),
            })?;
        let text = tmpl.render(messages, true)?;
        self.tokenizer.encode_prompt(&text)
    }
}
