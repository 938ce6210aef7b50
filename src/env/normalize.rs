//! Answer normalisation and matching, as the SQuAD evaluation script (and
//! Search-R1's `em_check`, which copies it) does:
//! lowercase, drop ASCII punctuation, drop the articles a/an/the, collapse
//! whitespace. Plus token-level SQuAD F1, and the number normalisation the
//! calculator task grades with.

/// Python's `string.punctuation`: SQuAD strips exactly these.
fn is_squad_punct(c: char) -> bool {
    c.is_ascii_punctuation()
}

/// A "word" character in Python's Unicode regex sense (`\w`); `_` is already
/// gone with the punctuation.
fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// SQuAD's `normalize_answer`.
///
/// Articles are removed the way `re.sub(r'\b(a|an|the)\b', ' ', s)` does: a
/// maximal run of word characters equal to an article becomes a space. That
/// is exact for the regex, unlike splitting on whitespace, which would keep
/// `the` in `the–end` where Python removes it.
pub fn normalize_answer(s: &str) -> String {
    let lowered: String = s
        .to_lowercase()
        .chars()
        .filter(|c| !is_squad_punct(*c))
        .collect();
    let mut out = String::with_capacity(lowered.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if matches!(word.as_str(), "a" | "an" | "the") {
            out.push(' ');
        } else {
            out.push_str(word);
        }
        word.clear();
    };
    for c in lowered.chars() {
        if is_word_char(c) {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Exact match after normalisation against any golden answer.
pub fn exact_match(prediction: &str, golden: &[String]) -> bool {
    let p = normalize_answer(prediction);
    golden.iter().any(|g| normalize_answer(g) == p)
}

/// SQuAD token F1 between one prediction and one ground truth. When either
/// side normalises to no token, F1 is 1 if both do and 0 otherwise (the
/// SQuAD v2 convention; v1 would divide by zero).
pub fn f1_score(prediction: &str, truth: &str) -> f64 {
    let pred = normalize_answer(prediction);
    let gold = normalize_answer(truth);
    let p: Vec<&str> = pred.split_whitespace().collect();
    let g: Vec<&str> = gold.split_whitespace().collect();
    if p.is_empty() || g.is_empty() {
        return if p.is_empty() && g.is_empty() {
            1.0
        } else {
            0.0
        };
    }
    // Multiset intersection (Python's Counter &): each gold token can be
    // matched once.
    let mut unused = g.clone();
    let mut same = 0usize;
    for tok in &p {
        if let Some(pos) = unused.iter().position(|u| u == tok) {
            unused.swap_remove(pos);
            same += 1;
        }
    }
    if same == 0 {
        return 0.0;
    }
    let precision = same as f64 / p.len() as f64;
    let recall = same as f64 / g.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

/// Best F1 over the golden answers (0 when there are none).
pub fn max_f1(prediction: &str, golden: &[String]) -> f64 {
    golden
        .iter()
        .map(|g| f1_score(prediction, g))
        .fold(0.0, f64::max)
}

/// Reads an answer as a number: trims, drops a leading `$`, thousands
/// separators (`1,250`) and a trailing period, then parses. `None` for
/// anything else (words, units, expressions): an exact-match task wants the
/// number alone.
pub fn parse_number(s: &str) -> Option<f64> {
    let s = s.trim();
    let s = s.strip_prefix('$').unwrap_or(s).trim_start();
    let s = s.strip_suffix('.').unwrap_or(s);
    let cleaned: String = s.chars().filter(|c| *c != ',').collect();
    if cleaned.is_empty()
        || !cleaned
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+'))
    {
        return None;
    }
    cleaned.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Numeric exact match against any golden answer: equal as numbers up to
/// 1e-9 relative tolerance (so `42.0` matches `42`), else normalised text
/// equality.
pub fn numeric_match(prediction: &str, golden: &[String]) -> bool {
    let Some(p) = parse_number(prediction) else {
        return exact_match(prediction, golden);
    };
    golden.iter().any(|g| match parse_number(g) {
        Some(v) => (p - v).abs() <= 1e-9 * v.abs().max(1.0),
        None => false,
    })
}
