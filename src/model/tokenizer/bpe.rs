//! Byte-level BPE as GGUF stores it: a vocabulary, ranked merges, token types.

use std::collections::HashMap;
use std::sync::Mutex;

use super::byte_level::{char_to_byte, encode_bytes};
use super::pretokenize::PreTokenizer;
use crate::model::TokenId;

/// Pieces seen often (words, spaces) are cached; beyond this many entries the cache
/// is cleared rather than grown, to bound memory on adversarial input.
const CACHE_LIMIT: usize = 100_000;

/// A byte-level BPE tokenizer.
#[derive(Debug)]
pub struct BpeTokenizer {
    tokens: Vec<String>,
    ids: HashMap<String, TokenId>,
    /// `(left, right) -> (rank, merged)`.
    merges: HashMap<(TokenId, TokenId), (u32, TokenId)>,
    /// The merges as given (`"left right"`, rank order), for export.
    merge_list: Vec<String>,
    /// Special tokens, longest first, matched literally before pre-tokenisation.
    specials: Vec<(String, TokenId)>,
    pre: PreTokenizer,
    cache: Mutex<HashMap<String, Vec<TokenId>>>,
}

impl BpeTokenizer {
    /// Builds the tokenizer. `merges` are `"left right"` strings in rank order;
    /// `specials` are the ids of control/user-defined tokens.
    pub fn new(
        tokens: Vec<String>,
        merges: &[String],
        specials: &[TokenId],
        pre: PreTokenizer,
    ) -> Result<Self, String> {
        let ids: HashMap<String, TokenId> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as TokenId))
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
        let mut specials: Vec<(String, TokenId)> = specials
            .iter()
            .filter_map(|&id| tokens.get(id as usize).map(|t| (t.clone(), id)))
            .filter(|(t, _)| !t.is_empty())
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        Ok(BpeTokenizer {
            tokens,
            ids,
            merges: merge_map,
            merge_list: merges.to_vec(),
            specials,
            pre,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Tokens in the vocabulary, specials included.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// Every token's text by id (byte-level alphabet for ordinary tokens).
    pub fn tokens(&self) -> &[String] {
        &self.tokens
    }

    /// The merges, `"left right"` in rank order.
    pub fn merge_list(&self) -> &[String] {
        &self.merge_list
    }

    /// Special tokens (matched literally before pre-tokenisation).
    pub fn specials(&self) -> impl Iterator<Item = (&str, TokenId)> {
        self.specials.iter().map(|(t, id)| (t.as_str(), *id))
    }

    /// How text is split into words before the merges apply.
    pub fn pre_tokenizer(&self) -> &PreTokenizer {
        &self.pre
    }

    /// The id of the token stored as `text` (byte-level alphabet for ordinary tokens),
    /// `None` if there is none.
    pub fn token_id(&self, text: &str) -> Option<TokenId> {
        self.ids.get(text).copied()
    }

    /// The token's text as stored (byte-level alphabet for ordinary tokens).
    pub fn token(&self, id: TokenId) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Whether `id` is one of the special tokens (for a GGUF file: its control and
    /// user-defined tokens).
    pub fn is_special(&self, id: TokenId) -> bool {
        self.specials.iter().any(|(_, s)| *s == id)
    }

    /// Encodes text; with `parse_special`, literal special-token text becomes that token.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<TokenId> {
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

    fn encode_ordinary(&self, text: &str, out: &mut Vec<TokenId>) {
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
    fn bpe(&self, piece: &str) -> Vec<TokenId> {
        let mut syms: Vec<TokenId> = Vec::with_capacity(piece.len());
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
    pub fn decode(&self, ids: &[TokenId]) -> String {
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
