//! The GGUF header reader on arbitrary bytes: every input is a `ModelError` or a
//! header, never a panic, an abort or an allocation the bytes do not justify.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = treegrpo::model::gguf::read_header(data, Path::new("fuzz.gguf")) {
        // A header that parses gives a tokenizer that works.
        if let Ok(ids) = header.tokenizer.encode("hello <|im_start|>world 123", true) {
            let _ = header.tokenizer.decode(&ids);
        }
        if let Some(t) = &header.chat_template {
            let _ = t.render(&[treegrpo::model::ChatMessage::new("user", "hi")], true);
        }
    }
});
