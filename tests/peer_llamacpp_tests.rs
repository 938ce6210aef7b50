//! The llama.cpp peer (feature `llamacpp`) on the default model: it loads the same
//! GGUF, generates from our prompt ids, and gives decode and prefill speeds. The
//! figures are printed for comparison (`treegrpo bench` sets them beside ours), not
//! checked against ours; what is checked is that the peer really ran the model and
//! that bad input is an error, not an abort of the process.
#![cfg(feature = "llamacpp")]

mod common;

use std::path::Path;
use std::sync::Mutex;

use treegrpo::bench::{decode_prompt, prefill_prompt};
use treegrpo::model::{ChatMessage, LoadedModel};
use treegrpo::peer::LlamaCppPeer;

/// The tests share the CPU: one at a time, so a speed figure is not halved.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn llamacpp_generates_from_our_prompt_ids() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let path = common::default_model();
    let ours = LoadedModel::load(&path).unwrap();
    let peer = LlamaCppPeer::load(&path, 2).unwrap();
    assert_eq!(peer.vocab_size(), ours.model.config().vocab_size);
    let prompt = ours
        .chat_prompt(&[ChatMessage::new("user", "What is the capital of France?")])
        .unwrap();
    let tokens = peer.greedy_tokens(&prompt, 16).unwrap();
    let text = ours.tokenizer.decode(&tokens).unwrap();
    eprintln!("llama.cpp, greedy: {text:?}");
    assert_eq!(tokens.len(), 16);
    assert!(tokens
        .iter()
        .all(|&t| (t as usize) < ours.model.config().vocab_size));
    // Greedy decoding is deterministic: the same ids give the same continuation.
    assert_eq!(peer.greedy_tokens(&prompt, 16).unwrap(), tokens);
    // A model run on garbage would not produce words from a chat prompt.
    assert!(
        text.chars().filter(|c| c.is_alphabetic()).count() >= 8,
        "{text:?}"
    );
}

#[test]
fn llamacpp_decode_and_prefill_speeds_are_positive() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let path = common::default_model();
    let ours = LoadedModel::load(&path).unwrap();
    let peer = LlamaCppPeer::load(&path, 2).unwrap();
    let prompt = decode_prompt(&ours).unwrap();
    for batch in [1, 3] {
        let tps = peer.decode_tokens_per_second(&prompt, batch, 8).unwrap();
        eprintln!("llama.cpp decode at batch {batch}: {tps:.1} tok/s");
        assert!(tps.is_finite() && tps > 0.0, "{tps}");
    }
    let long = prefill_prompt(&ours, 64).unwrap();
    assert_eq!(long.len(), 64);
    let tps = peer.prefill_tokens_per_second(&long, 2).unwrap();
    eprintln!("llama.cpp prefill of 64 tokens: {tps:.1} tok/s");
    assert!(tps.is_finite() && tps > 0.0, "{tps}");
}

#[test]
fn llamacpp_errors_instead_of_aborting() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    assert!(LlamaCppPeer::load(Path::new("/nonexistent/model.gguf"), 2).is_err());
    let not_gguf = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(not_gguf.path(), b"not a gguf file").unwrap();
    assert!(LlamaCppPeer::load(not_gguf.path(), 2).is_err());

    let peer = LlamaCppPeer::load(&common::default_model(), 2).unwrap();
    assert!(peer.decode_tokens_per_second(&[1, 2], 0, 8).is_err());
    assert!(peer.decode_tokens_per_second(&[1, 2], 2, 1).is_err());
    assert!(peer.decode_tokens_per_second(&[], 2, 8).is_err());
    assert!(peer.prefill_tokens_per_second(&[], 1).is_err());
    // An id past the vocabulary would make llama.cpp abort the process.
    let past = peer.vocab_size() as u32;
    assert!(peer.greedy_tokens(&[1, past], 4).is_err());
}
