//! Text a client sends is tokenised off the async workers: while two requests each
//! carrying a one-million-letter word (one pre-tokeniser piece) are tokenised, the
//! server's `/health` keeps answering within 100 ms, and both are answered.
//!
//! The model is tiny but speaks SmolLM2's vocabulary from a GGUF file, so the text goes
//! through the tokenizer every GGUF model gets. Its own test binary (one test): no
//! other test's engine work shares the server or the cores while it measures. Before
//! the fix, tokenising ran inside the handler on the runtime's two workers, and the
//! merge loop it ran was quadratic in the word's length (hours for this word).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::http;
use common::server::TestServer;
use common::tiny::{Flavour, TinyModel, Vocabulary};
use serde_json::json;
use treegrpo::engine::EngineConfig;
use treegrpo::model::LoadedModel;
use treegrpo::serve::ServeConfig;

/// A word of `n` seeded pseudo-random lowercase letters.
fn word(n: usize) -> String {
    let mut s = 0x5eed_u64;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (b'a' + (s % 26) as u8) as char
        })
        .collect()
}

#[test]
fn health_answers_within_100_ms_while_two_one_million_letter_words_are_tokenised() {
    let dir = tempfile::tempdir().unwrap();
    let vocab = Vocabulary::from_gguf(&common::default_model());
    let mut tiny = TinyModel::with_vocabulary(Flavour::Llama, 3, vocab, 16, 32);
    tiny.context = 1024;
    let path = dir.path().join("tiny-smollm-vocab.gguf");
    tiny.write_gguf(&path);
    let model = Arc::new(LoadedModel::load(&path).unwrap());
    let server = TestServer::start(model, EngineConfig::default(), ServeConfig::new("tiny"));
    let addr = server.addr;

    let text = Arc::new(word(1_000_000));
    let senders: Vec<_> = (0..2)
        .map(|_| {
            let text = text.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                let body = json!({"prompt": text.as_str(), "max_tokens": 1});
                let reply = http::post(addr, "/v1/completions", &body);
                (reply, started.elapsed())
            })
        })
        .collect();

    let mut probes = Vec::new();
    while !senders.iter().all(|s| s.is_finished()) {
        let t = Instant::now();
        let health = http::get(addr, "/health");
        probes.push(t.elapsed());
        assert_eq!(health.status, 200, "{}", health.text());
        std::thread::sleep(Duration::from_millis(20));
    }
    for sender in senders {
        let (reply, took) = sender.join().unwrap();
        // Answered: about 600,000 tokens are more than the context holds, which is
        // known only once the text is tokenised.
        assert_eq!(reply.status, 400, "{}", reply.text());
        let message = reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(message.contains("context"), "{message}");
        eprintln!("a one-million-letter prompt answered in {took:?}");
    }
    let slowest = probes.iter().max().copied().unwrap_or_default();
    eprintln!(
        "{} health probes while tokenising, slowest {slowest:?}",
        probes.len()
    );
    assert!(
        probes.len() >= 3,
        "only {} probes: tokenising took no time?",
        probes.len()
    );
    assert!(
        slowest < Duration::from_millis(100),
        "a health probe took {slowest:?}"
    );
}
