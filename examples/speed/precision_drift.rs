//! How far `--precision fast` moves the model from the exact path on real rollouts:
//! every trajectory of a `treegrpo rollout` output is scored teacher-forced by both
//! (one forward over prompt and response each), and on every model token it reports
//! |Δ logprob| of the sampled token and KL(exact ‖ fast) of the next-token
//! distributions at temperature 1, plus how often the greedy choice agrees. As a check
//! of the scoring itself, the exact path's logprobs are compared with the ones the
//! rollout recorded (equal up to f32 rounding when it sampled at temperature 1).
//!
//! `cargo run --release --example precision_drift -- DIR/trajectories.jsonl [MODEL]`

use std::io::BufRead;

use treegrpo::model::{BatchSeq, DenseKvStore, ForwardBatch, LoadedModel, LogitsWanted, Precision};

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v)) as f64;
    let lse = row
        .iter()
        .map(|&v| (v as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    row.iter().map(|&v| v as f64 - lse).collect()
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// Logits at every position of `tokens`, one forward.
fn logits(m: &LoadedModel, tokens: &[u32]) -> anyhow::Result<Vec<Vec<f32>>> {
    let cfg = m.model.config();
    let mut kv = DenseKvStore::new(cfg.num_layers, cfg.kv_dim());
    let slot = kv.add_sequence();
    let batch = ForwardBatch {
        seqs: vec![BatchSeq {
            slot,
            start: 0,
            tokens: tokens.to_vec(),
            logits: LogitsWanted::All,
        }],
    };
    Ok(m.model.forward(&batch, &mut kv)?.remove(0).rows)
}

fn ids(v: &serde_json::Value, key: &str) -> anyhow::Result<Vec<u32>> {
    v[key]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("no {key}"))?
        .iter()
        .map(|x| {
            x.as_u64()
                .map(|x| x as u32)
                .ok_or_else(|| anyhow::anyhow!("bad {key}"))
        })
        .collect()
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let file = args
        .next()
        .ok_or_else(|| anyhow::anyhow!("usage: precision_drift TRAJECTORIES.jsonl [MODEL]"))?;
    let path = match args.next() {
        Some(p) => p.into(),
        None => treegrpo::model::fetch::ensure_default_model(&mut |m| eprintln!("{m}"))?,
    };
    let exact = LoadedModel::load(&path)?;
    let fast = LoadedModel::load(&path)?.with_precision(Precision::Fast)?;
    let (mut n, mut same) = (0usize, 0usize);
    let (mut sum_d, mut max_d, mut sum_kl, mut max_kl, mut max_rec) = (0.0, 0f64, 0.0, 0f64, 0f64);
    let reader = std::io::BufReader::new(std::fs::File::open(&file)?);
    for (i, line) in reader.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(&line?)?;
        let prompt = ids(&v, "prompt_ids")?;
        let response = ids(&v, "response_ids")?;
        let mask = ids(&v, "response_mask")?;
        let recorded: Vec<f64> = v["response_logprobs"]
            .as_array()
            .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
            .unwrap_or_default();
        let at_t1 = v["temperature"].as_f64().unwrap_or(1.0) == 1.0;
        let tokens: Vec<u32> = prompt.iter().chain(&response).copied().collect();
        let (le, lf) = (logits(&exact, &tokens)?, logits(&fast, &tokens)?);
        for (j, (&tok, &m)) in response.iter().zip(&mask).enumerate() {
            if m == 0 {
                continue;
            }
            // The logits that predicted response token j sit one position before it.
            let pos = prompt.len() + j - 1;
            let (pe, pf) = (log_softmax(&le[pos]), log_softmax(&lf[pos]));
            let d = (pe[tok as usize] - pf[tok as usize]).abs();
            let kl: f64 = pe.iter().zip(&pf).map(|(a, b)| a.exp() * (a - b)).sum();
            sum_d += d;
            max_d = max_d.max(d);
            sum_kl += kl;
            max_kl = max_kl.max(kl);
            same += (argmax(&le[pos]) == argmax(&lf[pos])) as usize;
            if at_t1 && j < recorded.len() {
                max_rec = max_rec.max((pe[tok as usize] - recorded[j]).abs());
            }
            n += 1;
        }
        eprint!("\r{} trajectories, {n} model tokens", i + 1);
    }
    eprintln!();
    anyhow::ensure!(n > 0, "no model tokens in {file}");
    println!(
        "{n} model tokens: |Δ logprob| mean {:.4} max {:.4}; KL(exact‖fast) mean {:.5} max {:.4}; \
         greedy choice agrees at {:.1}%; exact recompute vs recorded logprobs: max |Δ| {:.2e}",
        sum_d / n as f64,
        max_d,
        sum_kl / n as f64,
        max_kl,
        100.0 * same as f64 / n as f64,
        max_rec
    );
    Ok(())
}
