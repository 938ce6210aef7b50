//! Tokenizers: text ↔ token ids.
//!
//! A GGUF file carries its vocabulary in metadata, which [`BpeTokenizer`] turns into a
//! byte-level BPE tokenizer of our own; an HF directory carries `tokenizer.json`, which
//! the `tokenizers` crate loads. [`Tokenizer`] hides which one a model uses.

pub mod bpe;
pub mod byte_level;
mod export;
pub mod pretokenize;

use std::path::Path;

pub use bpe::BpeTokenizer;
pub use pretokenize::PreTokenizer;

use super::error::ModelError;
use super::gguf_file::Metadata;
use super::TokenId;

/// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

#[derive(Debug)]
enum Backend {
    Bpe(Box<BpeTokenizer>),
    Hf(Box<tokenizers::Tokenizer>),
}

/// A model's tokenizer with its special tokens.
#[derive(Debug)]
pub struct Tokenizer {
    backend: Backend,
    bos: Option<TokenId>,
    /// Tokens that end a generation: the declared EOS plus chat end-of-turn markers.
    eos: Vec<TokenId>,
    add_bos: bool,
}

impl Tokenizer {
    /// Wraps a `tokenizers` tokenizer (HF directories).
    pub fn from_hf(
        tok: tokenizers::Tokenizer,
        bos: Option<TokenId>,
        eos: Vec<TokenId>,
        add_bos: bool,
    ) -> Self {
        Tokenizer {
            backend: Backend::Hf(Box::new(tok)),
            bos,
            eos,
            add_bos,
        }
    }

    /// Encodes text. Special-token text (e.g. `<|im_start|>`) becomes the special token
    /// when `parse_special` is set — right for chat templates we render, wrong for
    /// untrusted text such as tool observations.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<TokenId>, ModelError> {
        match &self.backend {
            Backend::Bpe(b) => Ok(b.encode(text, parse_special)),
            Backend::Hf(t) => {
                // Known limit: `tokenizers` always turns added-token text into the added
                // token, so for HF models `parse_special = false` is not honoured.
                let enc = t
                    .encode(text, false)
                    .map_err(|source| ModelError::Tokenizer {
                        context: "cannot encode the text",
                        source,
                    })?;
                Ok(enc.get_ids().to_vec())
            }
        }
    }

    /// Encodes a whole prompt: a BOS first when the model wants one.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<TokenId>, ModelError> {
        let mut ids = Vec::new();
        if self.add_bos {
            ids.extend(self.bos);
        }
        ids.extend(self.encode(text, true)?);
        Ok(ids)
    }

    /// Decodes ids, special tokens included as their text.
    pub fn decode(&self, ids: &[TokenId]) -> Result<String, ModelError> {
        match &self.backend {
            Backend::Bpe(b) => Ok(b.decode(ids)),
            Backend::Hf(t) => t
                .decode(ids, false)
                .map_err(|source| ModelError::Tokenizer {
                    context: "cannot decode the ids",
                    source,
                }),
        }
    }

    /// Tokens in the vocabulary, added tokens included (at most the model's
    /// `vocab_size`: loading checks it).
    pub fn vocab_size(&self) -> usize {
        match &self.backend {
            Backend::Bpe(b) => b.vocab_size(),
            Backend::Hf(t) => t.get_vocab_size(true),
        }
    }

    /// The id of the token whose stored text is `text`, `None` if there is none.
    pub fn token_id(&self, text: &str) -> Option<TokenId> {
        match &self.backend {
            Backend::Bpe(b) => b.token_id(text),
            Backend::Hf(t) => t.token_to_id(text),
        }
    }

    /// The beginning-of-sequence token, if the model declares one.
    pub fn bos(&self) -> Option<TokenId> {
        self.bos
    }

    /// Tokens that end a generation: the declared EOS plus the chat end-of-turn markers
    /// the vocabulary has (see [`stop_tokens`]).
    pub fn eos_ids(&self) -> &[TokenId] {
        &self.eos
    }

    fn id_text(&self, id: Option<TokenId>) -> String {
        let Some(id) = id else { return String::new() };
        match &self.backend {
            Backend::Bpe(b) => b.token(id).unwrap_or_default().to_string(),
            Backend::Hf(t) => t.id_to_token(id).unwrap_or_default(),
        }
    }

    /// The BOS token's text (chat templates refer to it).
    pub fn bos_text(&self) -> String {
        self.id_text(self.bos)
    }

    /// The EOS token's text (chat templates refer to it).
    pub fn eos_text(&self) -> String {
        self.id_text(self.eos.first().copied())
    }
}

/// Builds the tokenizer stored in GGUF metadata.
pub fn gguf_tokenizer(md: &Metadata<'_>) -> Result<Tokenizer, ModelError> {
    let missing = |msg: String| ModelError::MissingTokenizer {
        path: md.path.to_path_buf(),
        msg,
    };
    let model = md
        .string("tokenizer.ggml.model")
        .map_err(|_| missing("metadata 'tokenizer.ggml.model' is missing".into()))?;
    if model != "gpt2" {
        return Err(missing(format!(
            "tokenizer model '{model}' is not supported (only byte-level BPE, 'gpt2')"
        )));
    }
    let pre_name = match md.get("tokenizer.ggml.pre") {
        Some(_) => md.string("tokenizer.ggml.pre")?,
        None => "default",
    };
    let pre = PreTokenizer::from_gguf_name(pre_name).ok_or_else(|| {
        missing(format!(
            "pre-tokenizer '{pre_name}' is not supported (known: {})",
            PreTokenizer::known_names()
        ))
    })?;
    // A missing or mistyped key is the metadata's own error, naming file and key.
    let tokens = md.strings("tokenizer.ggml.tokens")?;
    let merges = md.strings("tokenizer.ggml.merges")?;
    let types = match md.get("tokenizer.ggml.token_type") {
        Some(_) => md.ints("tokenizer.ggml.token_type")?,
        None => Vec::new(),
    };
    let specials: Vec<TokenId> = types
        .iter()
        .enumerate()
        .filter(|(_, &t)| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
        .map(|(i, _)| i as TokenId)
        .collect();
    let bos = md
        .opt_usize("tokenizer.ggml.bos_token_id")?
        .map(|v| v as TokenId);
    let eos = md
        .opt_usize("tokenizer.ggml.eos_token_id")?
        .map(|v| v as TokenId);
    let add_bos = md.bool("tokenizer.ggml.add_bos_token").unwrap_or(false);
    let bpe = BpeTokenizer::new(tokens, &merges, &specials, pre).map_err(missing)?;
    let eos = stop_tokens(eos, |t| bpe.token_id(t));
    Ok(Tokenizer {
        backend: Backend::Bpe(Box::new(bpe)),
        bos,
        eos,
        add_bos,
    })
}

/// The declared EOS plus the end-of-turn markers of common chat formats, so that a
/// chat model stops at the end of its turn even when its EOS is another token.
pub fn stop_tokens(eos: Option<TokenId>, lookup: impl Fn(&str) -> Option<TokenId>) -> Vec<TokenId> {
    let mut ids: Vec<TokenId> = eos.into_iter().collect();
    for marker in ["<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<end_of_turn>"] {
        if let Some(id) = lookup(marker) {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    ids
}

/// Loads `tokenizer.json` from an HF directory.
pub fn hf_tokenizer_file(path: &Path) -> Result<tokenizers::Tokenizer, ModelError> {
    if !path.exists() {
        return Err(ModelError::MissingTokenizer {
            path: path.to_path_buf(),
            msg: "file not found".into(),
        });
    }
    tokenizers::Tokenizer::from_file(path).map_err(|source| ModelError::TokenizerFile {
        path: path.to_path_buf(),
        source,
    })
}
