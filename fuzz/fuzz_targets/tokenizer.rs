//! The default model's tokenizer (the smollm byte-level BPE) and chat template on
//! arbitrary text and token ids: the first byte picks what is fuzzed. Encode → decode
//! gives the text back byte for byte, less the bytes the vocabulary has no token for
//! (SmolLM2's lacks six ASCII control bytes among others; they are dropped, as HF's
//! BPE drops them: `tests/tokenizer_tests.rs` pins the list).

#![no_main]

#[allow(dead_code)]
#[path = "../../tests/common/tiny.rs"]
mod tiny;

use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use treegrpo::model::gguf::{read_header, GgufHeader};
use treegrpo::model::ChatMessage;

fn header() -> &'static GgufHeader {
    static HEADER: OnceLock<GgufHeader> = OnceLock::new();
    HEADER.get_or_init(|| {
        let path = treegrpo::model::fetch::ensure_default_model(&mut |m| eprintln!("{m}"))
            .expect("the default model");
        let bytes = std::fs::read(&path).expect("read the default model");
        read_header(&bytes, Path::new(&path)).expect("the default model's header")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let h = header();
    let text = String::from_utf8_lossy(rest);
    match which % 3 {
        0 => {
            let ids = h.tokenizer.encode(&text, false).expect("any text encodes");
            let back = h.tokenizer.decode(&ids).expect("its ids decode");
            let alphabet = tiny::byte_chars();
            let kept: Vec<u8> = text
                .bytes()
                .filter(|&b| {
                    h.tokenizer
                        .token_id(&alphabet[b as usize].to_string())
                        .is_some()
                })
                .collect();
            assert_eq!(
                back,
                String::from_utf8_lossy(&kept),
                "encode then decode changed the text"
            );
            let _ = h.tokenizer.encode(&text, true);
        }
        1 => {
            // Arbitrary ids, some outside the vocabulary: an error, never a panic.
            let ids: Vec<u32> = rest
                .chunks(2)
                .map(|c| u16::from_le_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32)
                .collect();
            let _ = h.tokenizer.decode(&ids);
        }
        _ => {
            if let Some(t) = &h.chat_template {
                let (role, content) = text.split_once('\n').unwrap_or(("user", &text));
                let _ = t.render(&[ChatMessage::new(role, content)], true);
            }
        }
    }
});
