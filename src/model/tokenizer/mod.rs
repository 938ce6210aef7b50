//! Tokenizers: text ↔ token ids.
//!
//! Every model's tokenizer is a `tokenizers::Tokenizer`: an HF directory carries it as
//! `tokenizer.json`; a GGUF file carries its vocabulary in metadata, from which
//! [`gguf::build`] assembles the same pipeline in memory. [`Tokenizer`] adds the
//! special tokens a generation needs and the one rule untrusted text needs: encoded
//! with special-token parsing off, text such as `<|im_end|>` stays text.

mod export;
pub mod gguf;
pub mod pretokenize;

use std::path::Path;

pub use pretokenize::PreTokenizer;

use super::error::ModelError;
use super::gguf_file::Metadata;
use super::TokenId;

/// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// A model's tokenizer with its special tokens.
#[derive(Debug)]
pub struct Tokenizer {
    /// Matches special-token text as the special token: for text we render (chat
    /// templates, prompts).
    parsing: Box<tokenizers::Tokenizer>,
    /// The same tokenizer with `encode_special_tokens` set: special-token text is
    /// encoded as the plain text it is (tool observations, retrieved documents). Kept
    /// as a second copy because the setting is the tokenizer's, not the call's, and a
    /// lock around one copy would serialise every encode.
    literal: Box<tokenizers::Tokenizer>,
    bos: Option<TokenId>,
    /// Tokens that end a generation: the declared EOS plus chat end-of-turn markers.
    eos: Vec<TokenId>,
    add_bos: bool,
}

impl Tokenizer {
    /// Wraps a `tokenizers` tokenizer (an HF directory's, or one built from GGUF).
    pub fn from_hf(
        tok: tokenizers::Tokenizer,
        bos: Option<TokenId>,
        eos: Vec<TokenId>,
        add_bos: bool,
    ) -> Self {
        let mut literal = tok.clone();
        literal.set_encode_special_tokens(true);
        Tokenizer {
            parsing: Box::new(tok),
            literal: Box::new(literal),
            bos,
            eos,
            add_bos,
        }
    }

    /// Encodes text. With `parse_special`, special-token text (e.g. `<|im_start|>`)
    /// becomes the special token — right for chat templates we render; without, it is
    /// encoded as plain text — right for untrusted text such as tool observations,
    /// which must never close a turn. Special means marked special in the tokenizer
    /// (for a GGUF: its control and user-defined tokens); an HF added token marked
    /// non-special (Qwen's `<tool_call>`, say) is matched either way, as HF does.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<TokenId>, ModelError> {
        let tok = if parse_special {
            &self.parsing
        } else {
            &self.literal
        };
        // `encode_fast`: the same ids, without the char offsets we never read.
        let enc = tok
            .encode_fast(text, false)
            .map_err(|source| ModelError::Tokenizer {
                context: "cannot encode the text",
                source,
            })?;
        Ok(enc.get_ids().to_vec())
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

    /// Decodes ids, special tokens included as their text; ids outside the vocabulary
    /// are skipped, bytes that do not form UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[TokenId]) -> Result<String, ModelError> {
        self.parsing
            .decode(ids, false)
            .map_err(|source| ModelError::Tokenizer {
                context: "cannot decode the ids",
                source,
            })
    }

    /// Tokens in the vocabulary, added tokens included (at most the model's
    /// `vocab_size`: loading checks it).
    pub fn vocab_size(&self) -> usize {
        self.parsing.get_vocab_size(true)
    }

    /// The id of the token whose stored text is `text` (the byte-level alphabet for
    /// ordinary tokens), `None` if there is none.
    pub fn token_id(&self, text: &str) -> Option<TokenId> {
        self.parsing.token_to_id(text)
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
        id.and_then(|id| self.parsing.id_to_token(id))
            .unwrap_or_default()
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
    let tok = gguf::build(&tokens, &merges, &specials, &pre).map_err(missing)?;
    let eos = stop_tokens(eos, |t| tok.token_to_id(t));
    Ok(Tokenizer::from_hf(tok, bos, eos, add_bos))
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
