//! What the model writes, parsed as the environments parse it: the action parser
//! (think blocks, tool calls, answers) and the calculator's expression evaluator.

#![no_main]

use libfuzzer_sys::fuzz_target;
use treegrpo::env::calc_eval::{calculate, evaluate};
use treegrpo::env::tags::Tags;
use treegrpo::env::{action::after_think, parse_action};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let tags = Tags::default();
    let action = parse_action(&text, &tags);
    let _ = (action.kind(), action.is_valid(), action.content());
    let rest = after_think(&text, &tags);
    assert!(text.ends_with(rest), "after_think returns a suffix");
    if let Ok(v) = evaluate(&text) {
        let _ = treegrpo::env::calc_eval::format_number(v);
    }
    let _ = calculate(&text);
});
