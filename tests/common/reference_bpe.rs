//! The GGUF byte-level BPE the crate used before `tokenizers` did its work
//! (`src/model/tokenizer/gguf.rs`), kept as the oracle that the new tokenizer gives the
//! same ids: the pre-tokeniser's regex split (with fancy-regex and NFC, as before),
//! then for each piece the merge loop that rescans the piece for the lowest-ranked
//! adjacent pair (leftmost on ties) and applies it — HF's rule, in O(n²) per piece.
//! Used by `tests/tokenizer_oracle_tests.rs` and `benches/tokenizer_bench.rs`; never on
//! a serving path.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use fancy_regex::Regex;
use unicode_normalization::UnicodeNormalization;

/// Pieces seen often (words, spaces) are cached; beyond this many entries the cache
/// is cleared rather than grown, to bound memory on adversarial input.
const CACHE_LIMIT: usize = 100_000;

/// `byte -> char` table of GPT-2's byte-level alphabet.
fn byte_to_char() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = ['\0'; 256];
        let mut next = 0u32;
        for b in 0..=255u8 {
            let printable = (b'!'..=b'~').contains(&b)
                || (0xA1..=0xAC).contains(&b)
                || (0xAE..=0xFF).contains(&b);
            table[b as usize] = if printable {
                b as char
            } else {
                let c = char::from_u32(256 + next).unwrap_or('\u{FFFD}');
                next += 1;
                c
            };
        }
        table
    })
}

fn char_to_byte(c: char) -> Option<u8> {
    let table = byte_to_char();
    let code = c as u32;
    if code < 256 && table[code as usize] == c {
        return Some(code as u8);
    }
    if (256..512).contains(&code) {
        return table.iter().position(|&t| t == c).map(|b| b as u8);
    }
    None
}

fn encode_bytes(text: &str) -> String {
    let table = byte_to_char();
    text.bytes().map(|b| table[b as usize]).collect()
}

/// A named splitting scheme.
#[derive(Debug)]
pub struct ReferenceSplit {
    /// Split every numeric character into its own piece first (SmolLM, StarCoder).
    isolate_digits: bool,
    /// Apply NFC before splitting (Qwen2).
    nfc: bool,
    regex: Regex,
}

impl ReferenceSplit {
    /// The scheme for a `tokenizer.ggml.pre` name, or `None` if we do not know it.
    pub fn from_gguf_name(name: &str) -> Option<Self> {
        // The scheme table (regex, digit split, NFC) is data, read from the library;
        // the oracle is the splitting and merging done with it.
        let scheme = treegrpo::model::tokenizer::PreTokenizer::from_gguf_name(name)?;
        let (pattern, isolate_digits, nfc) = (
            scheme.pattern(),
            scheme.isolates_digits(),
            scheme.normalizes_nfc(),
        );
        let regex = Regex::new(pattern).ok()?;
        Some(ReferenceSplit {
            isolate_digits,
            nfc,
            regex,
        })
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

/// A byte-level BPE tokenizer.
#[derive(Debug)]
pub struct ReferenceBpe {
    tokens: Vec<String>,
    ids: HashMap<String, u32>,
    /// `(left, right) -> (rank, merged)`.
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Special tokens, longest first, matched literally before pre-tokenisation.
    specials: Vec<(String, u32)>,
    pre: ReferenceSplit,
    cache: Mutex<HashMap<String, Vec<u32>>>,
}

impl ReferenceBpe {
    /// Builds the tokenizer. `merges` are `"left right"` strings in rank order;
    /// `specials` are the ids of control/user-defined tokens.
    pub fn new(
        tokens: Vec<String>,
        merges: &[String],
        specials: &[u32],
        pre: ReferenceSplit,
    ) -> Result<Self, String> {
        let ids: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let mut merge_map = HashMap::with_capacity(merges.len());
        for (rank, m) in merges.iter().enumerate() {
            let Some((a, b)) = m.split_once(' ') else {
                return Err(format!("merge {rank} ('{m}') is not two tokens"));
            };
            let (Some(&ia), Some(&ib), Some(&im)) =
                (ids.get(a), ids.get(b), ids.get(&format!("{a}{b}")))
            else {
                // A merge whose parts or result are not in the vocabulary can never fire.
                continue;
            };
            merge_map.entry((ia, ib)).or_insert((rank as u32, im));
        }
        let mut specials: Vec<(String, u32)> = specials
            .iter()
            .filter_map(|&id| tokens.get(id as usize).map(|t| (t.clone(), id)))
            .filter(|(t, _)| !t.is_empty())
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        Ok(ReferenceBpe {
            tokens,
            ids,
            merges: merge_map,
            specials,
            pre,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Tokens in the vocabulary, specials included.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The id of the token stored as `text` (byte-level alphabet for ordinary tokens),
    /// `None` if there is none.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// The token's text as stored (byte-level alphabet for ordinary tokens).
    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Whether `id` is one of the special tokens (for a GGUF file: its control and
    /// user-defined tokens).
    pub fn is_special(&self, id: u32) -> bool {
        self.specials.iter().any(|(_, s)| *s == id)
    }

    /// Encodes text; with `parse_special`, literal special-token text becomes that token.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::new();
        if !parse_special || self.specials.is_empty() {
            self.encode_ordinary(text, &mut out);
            return out;
        }
        let mut rest = text;
        let mut plain_start = 0;
        let mut i = 0;
        while i < rest.len() {
            let hit = self
                .specials
                .iter()
                .find(|(s, _)| rest[i..].starts_with(s.as_str()));
            if let Some((s, id)) = hit {
                self.encode_ordinary(&rest[plain_start..i], &mut out);
                out.push(*id);
                rest = &rest[i + s.len()..];
                i = 0;
                plain_start = 0;
            } else {
                i += rest[i..].chars().next().map_or(1, char::len_utf8);
            }
        }
        self.encode_ordinary(&rest[plain_start..], &mut out);
        out
    }

    fn encode_ordinary(&self, text: &str, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        for piece in self.pre.split(text) {
            let mapped = encode_bytes(&piece);
            if let Ok(cache) = self.cache.lock() {
                if let Some(ids) = cache.get(&mapped) {
                    out.extend_from_slice(ids);
                    continue;
                }
            }
            let ids = self.bpe(&mapped);
            out.extend_from_slice(&ids);
            if let Ok(mut cache) = self.cache.lock() {
                if cache.len() >= CACHE_LIMIT {
                    cache.clear();
                }
                cache.insert(mapped, ids);
            }
        }
    }

    /// Merges one piece: repeatedly applies the lowest-ranked adjacent merge (leftmost
    /// first on ties), the rule HF's BPE model follows.
    fn bpe(&self, piece: &str) -> Vec<u32> {
        let mut syms: Vec<u32> = Vec::with_capacity(piece.len());
        for c in piece.chars() {
            let mut buf = [0u8; 4];
            match self.ids.get(c.encode_utf8(&mut buf) as &str) {
                Some(&id) => syms.push(id),
                // A byte-level vocabulary holds all 256 byte characters; if this one
                // lacks some, drop the character rather than invent an id.
                None => continue,
            }
        }
        loop {
            let best = syms
                .windows(2)
                .enumerate()
                .filter_map(|(i, w)| self.merges.get(&(w[0], w[1])).map(|&(r, m)| (r, i, m)))
                .min();
            let Some((_, i, merged)) = best else { break };
            syms[i] = merged;
            syms.remove(i + 1);
        }
        syms
    }

    /// Decodes ids to text; bytes that do not form UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            let Some(tok) = self.tokens.get(id as usize) else {
                continue;
            };
            if self.is_special(id) {
                bytes.extend_from_slice(tok.as_bytes());
                continue;
            }
            for c in tok.chars() {
                match char_to_byte(c) {
                    Some(b) => bytes.push(b),
                    None => {
                        let mut buf = [0u8; 4];
                        bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                }
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl ReferenceBpe {
    /// The oracle for a vocabulary (its control tokens as the specials) split by the
    /// scheme `tokenizer.ggml.pre` names.
    pub fn from_vocabulary(vocab: &super::tiny::Vocabulary, pre: &str) -> Self {
        let merges: Vec<String> = vocab
            .merges
            .iter()
            .map(|(a, b)| format!("{a} {b}"))
            .collect();
        let split = ReferenceSplit::from_gguf_name(pre).expect("a known pre-tokenizer");
        ReferenceBpe::new(vocab.tokens.clone(), &merges, &vocab.specials, split).unwrap()
    }
}
