//! Pre-tokenisation schemes: how text is split into pieces before the BPE merges
//! apply inside each piece.
//!
//! GGUF names the scheme in `tokenizer.ggml.pre`; these are the regexes llama.cpp and
//! the HF tokenizers use for each name. A scheme is only a description here: the
//! `tokenizers` pipeline built from it (`gguf.rs`) does the splitting.

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A named splitting scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreTokenizer {
    /// The `tokenizer.ggml.pre` name it was made from.
    name: String,
    /// Split every numeric character into its own piece first (SmolLM, StarCoder).
    isolate_digits: bool,
    /// Apply NFC before splitting (Qwen2).
    nfc: bool,
    pattern: &'static str,
}

impl PreTokenizer {
    /// The scheme for a `tokenizer.ggml.pre` name, or `None` if we do not know it.
    pub fn from_gguf_name(name: &str) -> Option<Self> {
        let (pattern, isolate_digits, nfc) = match name {
            "default" | "gpt2" | "gpt-2" => (GPT2, false, false),
            "smollm" | "starcoder" | "refact" => (GPT2, true, false),
            "qwen2" => (QWEN2, false, true),
            "llama3" | "llama-bpe" | "llama-v3" => (LLAMA3, false, false),
            _ => return None,
        };
        Some(PreTokenizer {
            name: name.to_string(),
            isolate_digits,
            nfc,
            pattern,
        })
    }

    /// The `tokenizer.ggml.pre` name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The regex the pieces are matched with (after the digit split and NFC).
    pub fn pattern(&self) -> &str {
        self.pattern
    }

    /// Whether the pattern is GPT-2's, which HF's `ByteLevel(use_regex = true)` applies
    /// itself.
    pub fn is_gpt2_pattern(&self) -> bool {
        self.pattern == GPT2
    }

    /// Whether digits are split one by one first.
    pub fn isolates_digits(&self) -> bool {
        self.isolate_digits
    }

    /// Whether text is NFC-normalised first.
    pub fn normalizes_nfc(&self) -> bool {
        self.nfc
    }

    /// The names [`Self::from_gguf_name`] accepts, for error messages.
    pub fn known_names() -> &'static str {
        "default, gpt2, smollm, starcoder, refact, qwen2, llama3, llama-bpe"
    }
}
