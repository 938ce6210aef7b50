//! `treegrpo update` as a user runs it.
//!
//! - Bad input gets a clear error naming the file and line, exit status 1, and
//!   nothing is written to `--out`.
//! - With SGD, the checkpoint it writes holds exactly `w − lr × g` for every weight,
//!   `g` computed in this process by the library on the same file.
//! - The checkpoint runs in `treegrpo generate --model`.

mod common;

use common::treegrpo;

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use common::tiny::{Flavour, TinyModel};
use treegrpo::model::LoadedModel;
use treegrpo::train::input::read_trajectories;
use treegrpo::train::{LossConfig, Params, Update, UpdateConfig};

/// A tiny HF model (dense f32 safetensors, so the checkpoint's names and layout are
/// the source's) in `dir/model`.
fn tiny_model(dir: &Path) -> PathBuf {
    let tiny = TinyModel::new(Flavour::Llama, 12);
    let path = dir.join("model");
    tiny.write_hf(&path, DType::F32, 1);
    path
}

fn record(prompt: &[u32], response: &[u32], mask: &[u8], adv: &str) -> String {
    let logprobs: Vec<f32> = mask
        .iter()
        .map(|&m| if m == 1 { -2.5 } else { 0.0 })
        .collect();
    format!(
        r#"{{"prompt_uid":"p","tree_id":0,"leaf_id":1,"node_path":[0,1],"prompt_ids":{prompt:?},"response_ids":{response:?},"response_mask":{mask:?},"response_logprobs":{logprobs:?},"reward":1.0,"score":null,"num_turns":1,"advantage":{adv},"temperature":0.9}}"#
    )
}

fn good_lines() -> Vec<String> {
    vec![
        record(&[5, 40, 41], &[42, 43, 90, 91, 44], &[1, 1, 0, 0, 1], "0.8"),
        record(
            &[5, 40, 41],
            &[42, 43, 92, 93, 45, 46],
            &[1, 1, 0, 0, 1, 1],
            "-0.8",
        ),
        record(&[5, 60], &[61, 62, 63], &[1, 1, 1], "0.25"),
    ]
}

fn run_update(model: &Path, traj: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    treegrpo()
        .arg("update")
        .arg("--model")
        .arg(model)
        .arg("--trajectories")
        .arg(traj)
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn bad_input_is_named_by_file_and_line_and_nothing_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let vocab = TinyModel::new(Flavour::Llama, 12).vocab.tokens.len();
    let oov = record(&[5, 40], &[vocab as u32 + 7], &[1], "1.0");
    let short_mask = record(&[5, 40], &[41, 42], &[1], "1.0");
    let null_adv = record(&[5, 40], &[41, 42], &[1, 1], "null");
    let nan_adv = record(&[5, 40], &[41, 42], &[1, 1], "NaN");
    let mut short_logprobs = record(&[5, 40], &[41, 42], &[1, 1], "1.0");
    short_logprobs = short_logprobs.replace("[-2.5, -2.5]", "[-2.5]");
    let cases: Vec<(&str, String, &str)> = vec![
        ("oov", oov, "outside the model's vocabulary"),
        ("mask", short_mask, "2 response ids but 1 mask values"),
        ("logprobs", short_logprobs, "2 response ids but 1 logprobs"),
        ("null-advantage", null_adv, "advantage is missing"),
        ("nan-advantage", nan_adv, "not a trajectory record"),
    ];
    for (name, bad, expect) in cases {
        let mut lines = good_lines();
        lines.insert(1, bad);
        let traj = tmp.path().join(format!("{name}.jsonl"));
        std::fs::write(&traj, lines.join("\n") + "\n").unwrap();
        let out = tmp.path().join(format!("out-{name}"));
        let o = run_update(&model, &traj, &out, &[]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("{}, line 2:", traj.display())) && stderr.contains(expect),
            "{name}: {stderr}"
        );
        assert!(!out.exists(), "{name}: {} was written", out.display());
    }

    let empty = tmp.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let out = tmp.path().join("out-empty");
    let o = run_update(&model, &empty, &out, &[]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("empty.jsonl") && stderr.contains("no trajectories"),
        "{stderr}"
    );
    assert!(!out.exists());

    // A model folder without weights.
    let no_weights = tmp.path().join("no-weights");
    std::fs::create_dir(&no_weights).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(model.join(f), no_weights.join(f)).unwrap();
    }
    let traj = tmp.path().join("good.jsonl");
    std::fs::write(&traj, good_lines().join("\n")).unwrap();
    let o = run_update(&no_weights, &traj, &out, &[]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("no-weights") && stderr.contains("model.safetensors"),
        "{stderr}"
    );
    assert!(!out.exists());
}

#[test]
fn sgd_update_writes_exactly_w_minus_lr_times_g_and_the_checkpoint_generates() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let traj = tmp.path().join("trajectories.jsonl");
    std::fs::write(&traj, good_lines().join("\n") + "\n").unwrap();
    let out = tmp.path().join("updated");
    let lr = 0.25; // a power of two: lr·g is exact in f32
    let o = run_update(
        &model,
        &traj,
        &out,
        &[
            "--optimizer",
            "sgd",
            "--lr",
            "0.25",
            "--max-grad-norm",
            "0",
            "--micro-batch-tokens",
            "12",
        ],
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let line: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for key in [
        "loss",
        "pg_loss",
        "kl",
        "entropy",
        "grad_norm",
        "clip_fraction",
        "tis_mean",
        "tokens",
        "seconds",
        "peak_rss_bytes",
    ] {
        assert!(
            line.get(key).is_some_and(|v| v.is_number()),
            "{key}: {line}"
        );
    }
    assert_eq!(line["tokens"], 3 + 4 + 3);
    assert!(
        line["tokens_forwarded"]["packed"].as_u64() < line["tokens_forwarded"]["unpacked"].as_u64()
    );

    // The same gradient, here.
    let m = LoadedModel::load(&model).unwrap();
    let p = Params::from_model(&m.model, DType::F32).unwrap();
    let data = read_trajectories(&traj, m.model.config()).unwrap();
    assert_eq!(data.temperature, 0.9);
    let cfg = UpdateConfig {
        loss: LossConfig::default(),
        max_grad_norm: 0.0,
        packed: true,
        micro_batch_tokens: 12,
        temperature: data.temperature,
    };
    let g = Update::new(&p, &data.samples, &cfg)
        .gradients()
        .unwrap()
        .grads
        .unwrap();
    let saved =
        candle_core::safetensors::load(out.join("model.safetensors"), &Device::Cpu).unwrap();
    let flat = |t: &candle_core::Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let mut moved = 0;
    for ((name, var), g) in p.named().iter().zip(&g) {
        let (w, g, after) = (flat(var.as_tensor()), flat(g), flat(&saved[name]));
        for i in 0..w.len() {
            assert_eq!(after[i], w[i] - lr as f32 * g[i], "{name}[{i}]");
            moved += usize::from(after[i] != w[i]);
        }
    }
    assert!(moved > 1000, "only {moved} weights moved");

    let o = treegrpo()
        .args(["generate", "--max-tokens", "4", "--prompt", "hi", "--model"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
