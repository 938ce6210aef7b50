//! Checkpoints: an HF directory that `--model` loads, with the same logits as the
//! in-memory model; a save interrupted part-way leaves the previous checkpoint whole;
//! the optimiser state comes back; the tokenizer written from GGUF metadata encodes
//! exactly as the GGUF one.

mod common;

use candle_core::DType;
use common::tiny::{logits_all, Flavour, TinyModel};
use treegrpo::model::{ChatMessage, LoadedModel};
use treegrpo::train::checkpoint::save_checkpoint_stopping_after;
use treegrpo::train::pack::pack;
use treegrpo::train::{
    load_optimizer, save_checkpoint, CheckpointExtras, Optimizer, OptimizerConfig, Params,
    TrainSample, Update, UpdateConfig,
};

fn extras<'a>(m: &'a LoadedModel, opt: Option<&'a Optimizer>) -> CheckpointExtras<'a> {
    CheckpointExtras {
        loop_state: None,
        tokenizer: &m.tokenizer,
        chat_template: m.chat_template.as_ref(),
        optimizer: opt,
    }
}

/// `tiny` written as GGUF in `dir`, loaded, and its trainable parameters.
fn load_tiny(dir: &std::path::Path, tiny: &TinyModel) -> (LoadedModel, Params) {
    let gguf = dir.join("tiny.gguf");
    tiny.write_gguf(&gguf);
    let m = LoadedModel::load(&gguf).unwrap();
    let p = Params::from_model(&m.model, DType::F32).unwrap();
    (m, p)
}

const TOKENS: [u32; 9] = [5, 40, 41, 90, 42, 43, 120, 44, 45];

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| common::max_abs_diff(x, y))
        .fold(0.0, f32::max)
}

fn trainer_logp(p: &Params) -> Vec<f32> {
    let wanted = vec![true; TOKENS.len()];
    let packed = &pack(&[(&TOKENS, &wanted)], true, 1 << 20)[0];
    p.score(&packed.batch, 1.0, false)
        .unwrap()
        .logp
        .to_vec1::<f32>()
        .unwrap()
}

#[test]
fn a_checkpoint_reloads_with_the_same_logits_in_the_engine_and_the_trainer() {
    for flavour in [Flavour::Llama, Flavour::Qwen2] {
        let tmp = tempfile::tempdir().unwrap();
        let (m, p) = load_tiny(tmp.path(), &TinyModel::new(flavour, 6));
        let dir = tmp.path().join("ckpt");
        save_checkpoint(&dir, &p, extras(&m, None)).unwrap();
        let back = LoadedModel::load(&dir).unwrap();
        // The engine on the checkpoint (HF layout, half-split RoPE) against the GGUF
        // (permuted Q/K for llama, interleaved RoPE).
        let d = max_diff(&logits_all(&m, &TOKENS), &logits_all(&back, &TOKENS));
        assert!(d < 1e-4, "{flavour:?}: engine logits differ by {d}");
        // The trainer on the checkpoint against the in-memory parameters.
        let p2 = Params::from_model(&back.model, DType::F32).unwrap();
        let d = common::max_abs_diff(&trainer_logp(&p), &trainer_logp(&p2));
        assert!(d < 1e-4, "{flavour:?}: trainer logprobs differ by {d}");
        // Tokenizer and chat template came along.
        let chat = [ChatMessage::new("user", "hi 12 there")];
        assert_eq!(
            m.chat_prompt(&chat).unwrap(),
            back.chat_prompt(&chat).unwrap()
        );
    }
}

#[test]
fn an_interrupted_save_leaves_the_previous_checkpoint_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, p) = load_tiny(tmp.path(), &TinyModel::new(Flavour::Llama, 2));
    let dir = tmp.path().join("ckpt");
    save_checkpoint(&dir, &p, extras(&m, None)).unwrap();
    let before = logits_all(&LoadedModel::load(&dir).unwrap(), &TOKENS);

    // Change the weights, then "crash" before each file in turn.
    let w = p.final_norm.as_tensor();
    p.final_norm.set(&(w * 2.0).unwrap()).unwrap();
    for stop in 0..6 {
        let err = save_checkpoint_stopping_after(&dir, &p, extras(&m, None), Some(stop));
        assert!(err.is_err());
        let still = logits_all(&LoadedModel::load(&dir).unwrap(), &TOKENS);
        assert_eq!(max_diff(&before, &still), 0.0, "stopped before file {stop}");
    }
    // A whole save replaces it and clears the leftovers.
    save_checkpoint(&dir, &p, extras(&m, None)).unwrap();
    let after = logits_all(&LoadedModel::load(&dir).unwrap(), &TOKENS);
    assert!(max_diff(&before, &after) > 1e-3);
    let names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| !n.contains(".partial") && !n.contains(".previous")),
        "{names:?}"
    );
}

#[test]
fn adamw_state_is_saved_and_restored() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, p) = load_tiny(tmp.path(), &TinyModel::small(Flavour::Qwen2, 3));
    let sample = TrainSample {
        tokens: TOKENS.to_vec(),
        prompt_len: 3,
        response_mask: vec![1, 1, 0, 1, 1, 1],
        rollout_logprobs: None,
        old_logprobs: None,
        ref_logprobs: None,
        advantage: -0.7,
    };
    let cfg = UpdateConfig::default();
    let mut opt = Optimizer::new(OptimizerConfig::default());
    let g = Update::new(&p, &[sample], &cfg)
        .gradients()
        .unwrap()
        .grads
        .unwrap();
    opt.step(&p, &g).unwrap();
    let dir = tmp.path().join("ckpt");
    save_checkpoint(&dir, &p, extras(&m, Some(&opt))).unwrap();
    let back = LoadedModel::load(&dir).unwrap();
    let p2 = Params::from_model(&back.model, DType::F32).unwrap();
    let restored = load_optimizer(&dir, &p2).unwrap().expect("state saved");
    assert_eq!((restored.step, restored.config), (1, opt.config));
    assert_eq!(restored.moments.len(), opt.moments.len());
    for ((a, b), (c, d)) in restored.moments.iter().zip(&opt.moments) {
        let flat = |t: &candle_core::Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(flat(a), flat(c));
        assert_eq!(flat(b), flat(d));
    }
}

#[test]
fn the_default_models_tokenizer_written_as_tokenizer_json_encodes_the_same() {
    let m = LoadedModel::load(&common::default_model()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("tokenizer.json");
    std::fs::write(&path, m.tokenizer.to_hf_json().unwrap()).unwrap();
    let hf = tokenizers::Tokenizer::from_file(&path).unwrap();
    let texts = [
        "Which river flows through Paris? <search>Seine river 1234</search>",
        "  leading spaces, tabs\tand\nnewlines\n\n",
        "Ünïcödé — “quotes” 3.14159 ½ 日本語 🙂",
        "<|im_start|>user\nWhat is 12*7?<|im_end|>\n<|im_start|>assistant\n",
        "don't won't it's we'll I'M",
    ];
    for t in texts {
        let ours = m.tokenizer.encode(t, true).unwrap();
        let theirs = hf.encode(t, false).unwrap().get_ids().to_vec();
        assert_eq!(ours, theirs, "{t:?}");
    }
}
