//! Pre-tokenisers: how text is split into pieces before BPE merges inside each piece.
//!
//! GGUF names the scheme in `tokenizer.ggml.pre`; these are the regexes llama.cpp and
//! the HF tokenizers use for each name.

use fancy_regex::Regex;
use unicode_normalization::UnicodeNormalization;

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A named splitting scheme.
#[derive(Debug)]
pub struct PreTokenizer {
    /// The `tokenizer.ggml.pre` name it was made from.
    name: String,
    /// Split every numeric character into its own piece first (SmolLM, StarCoder).
    isolate_digits: bool,
    /// Apply NFC before splitting (Qwen2).
    nfc: bool,
    regex: Regex,
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
        let regex = Regex::new(pattern).ok()?;
        Some(PreTokenizer {
            name: name.to_string(),
            isolate_digits,
            nfc,
            regex,
        })
    }

    /// The `tokenizer.ggml.pre` name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The regex the pieces are matched with (after the digit split and NFC).
    pub fn pattern(&self) -> &str {
        self.regex.as_str()
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

    /// Splits `text` into pieces that BPE encodes independently.
    pub fn split(&self, text: &str) -> Vec<String> {
        let text: String = if self.nfc {
            text.nfc().collect()
        } else {
            text.to_string()
        };
        let mut pieces = Vec::new();
        if self.isolate_digits {
            let mut run = String::new();
            for c in text.chars() {
                if c.is_numeric() {
                    if !run.is_empty() {
                        self.split_regex(&run, &mut pieces);
                        run.clear();
                    }
                    pieces.push(c.to_string());
                } else {
                    run.push(c);
                }
            }
            if !run.is_empty() {
                self.split_regex(&run, &mut pieces);
            }
        } else {
            self.split_regex(&text, &mut pieces);
        }
        pieces
    }

    fn split_regex(&self, text: &str, out: &mut Vec<String>) {
        let mut last = 0;
        for m in self.regex.find_iter(text) {
            let Ok(m) = m else {
                // Backtracking limit hit: keep the rest whole rather than lose text.
                break;
            };
            if m.start() > last {
                out.push(text[last..m.start()].to_string());
            }
            out.push(m.as_str().to_string());
            last = m.end();
        }
        if last < text.len() {
            out.push(text[last..].to_string());
        }
    }
}
