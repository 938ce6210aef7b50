//! Tokenising, the GGUF tokenizer we serve (`tokenizers` built from the default
//! model's vocabulary, `src/model/tokenizer/gguf.rs`) against the merge loop it
//! replaced (`tests/common/reference_bpe.rs`): `cargo bench --bench tokenizer_bench`.
//!
//! Inputs: one word of seeded random lowercase letters at 10 kB, 100 kB and 1 MB (a
//! run of letters is one piece, so the merge loop's rescans make it quadratic), and
//! real prose — the search task's corpus (about 490 kB of encyclopedia text). Each is
//! encoded with special-token parsing off, as an observation is, best of three runs.
//! The old loop runs only at the sizes its projected time stays under a minute (its
//! time grows with the square of the word's length); both give the same ids wherever
//! both run, which the bench checks.
//!
//! Prints a table: input, bytes, ids, the new tokenizer's time and MB/s, the old one's.

#[allow(dead_code)]
#[path = "../tests/common/reference_bpe.rs"]
mod reference_bpe;
#[allow(dead_code)]
#[path = "../tests/common/tiny.rs"]
mod tiny;

use std::time::{Duration, Instant};

use reference_bpe::ReferenceBpe;
use tiny::Vocabulary;
use treegrpo::model::LoadedModel;
use treegrpo::random::{SplitMix64, Uniform};

/// The old loop is skipped where its projected time passes this.
const OLD_BUDGET: Duration = Duration::from_secs(60);

fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut out = None;
    for _ in 0..runs {
        let t = Instant::now();
        let r = f();
        best = best.min(t.elapsed());
        out = Some(r);
    }
    (best, out.expect("at least one run"))
}

fn word(bytes: usize, seed: u64) -> String {
    // The library's SplitMix64, for a reproducible letter sequence.
    let mut s = SplitMix64::new(seed);
    (0..bytes)
        .map(|_| (b'a' + (s.next_u64() % 26) as u8) as char)
        .collect()
}

fn mb_per_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64()
}

fn main() {
    let path = treegrpo::model::fetch::ensure_default_model(&mut |m| eprintln!("{m}"))
        .expect("the default model could not be fetched");
    let model = LoadedModel::load(&path).expect("the default model loads");
    let old = ReferenceBpe::from_vocabulary(&Vocabulary::from_gguf(&path), "smollm");
    let corpus = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/multihop/corpus.jsonl"),
    )
    .expect("the corpus");
    let mut inputs: Vec<(String, String)> = [10_000, 100_000, 1_000_000]
        .iter()
        .map(|&n| (format!("one word, {} kB", n / 1000), word(n, 7)))
        .collect();
    inputs.push(("prose (search corpus)".into(), corpus));

    println!(
        "| input | bytes | ids | new | new MB/s | old | old MB/s |\n|---|---:|---:|---:|---:|---:|---:|"
    );
    let mut last_old: Option<(usize, Duration)> = None;
    for (name, text) in &inputs {
        let (new_t, ids) = best_of(3, || model.tokenizer.encode(text, false).unwrap());
        // Quadratic in a word's length: project from the last word size it ran at.
        let projected = last_old
            .filter(|_| name.starts_with("one word"))
            .map(|(n, d)| d.mul_f64((text.len() as f64 / n as f64).powi(2)));
        let old_cell = if projected.is_some_and(|p| p > OLD_BUDGET) {
            let p = projected.expect("checked");
            format!("skipped (projected {:.0} s) | —", p.as_secs_f64())
        } else {
            let runs = if name.starts_with("one word") { 1 } else { 3 };
            let (old_t, old_ids) = best_of(runs, || old.encode(text, false));
            assert_eq!(old_ids, ids, "{name}: the two tokenizers disagree");
            if name.starts_with("one word") {
                last_old = Some((text.len(), old_t));
            }
            format!(
                "{:.3} s | {:.2}",
                old_t.as_secs_f64(),
                mb_per_s(text.len(), old_t)
            )
        };
        println!(
            "| {name} | {} | {} | {:.3} s | {:.2} | {old_cell} |",
            text.len(),
            ids.len(),
            new_t.as_secs_f64(),
            mb_per_s(text.len(), new_t),
        );
    }
}
