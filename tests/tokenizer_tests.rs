//! Our GGUF tokenizer (a `tokenizers` pipeline assembled from GGUF metadata by
//! `src/model/tokenizer/gguf.rs`) against the tokenizer SmolLM2 itself ships, both built
//! from the SAME vocabulary and merges: the ones stored in the default model's GGUF
//! metadata (SmolLM2-135M-Instruct, `tokenizer.ggml.pre = smollm`).
//!
//! The reference side is assembled by hand the way SmolLM2's own `tokenizer.json` is: a
//! BPE model over `tokenizer.ggml.tokens` / `tokenizer.ggml.merges`, the pre-tokenizer
//! `Sequence[Digits(individual_digits), ByteLevel(add_prefix_space=false, regex)]`, a
//! ByteLevel decoder, and every control token (`token_type == 3`) as a special added
//! token. The GGUF metadata is read with candle's reader, not ours. (The merge loop our
//! GGUF tokenizer used before is the oracle of `tokenizer_oracle_tests.rs`.)
//!
//! Why: a tokenizer that differs from the one the model was trained with gives the model
//! token sequences it never saw; the damage is silent (plausible but worse text). So for
//! a table of inputs chosen to hit the pre-tokenizer's corners — unicode, code, runs of
//! whitespace, digits, special tokens — both directions must agree exactly: the same
//! ids from `encode`, the same text from `decode`, and that text equal to the input.
//!
//! The chat-template tests pin the exact ChatML text the GGUF's own Jinja template
//! renders, including SmolLM2's default system prompt when none is given.

mod common;

use std::sync::OnceLock;

use candle_core::quantized::gguf_file::Content;
use common::tiny::Vocabulary;
use treegrpo::model::{ChatMessage, LoadedModel};

struct Pair {
    ours: LoadedModel,
    theirs: tokenizers::Tokenizer,
}

/// Loaded once per test binary: the default model and the reference tokenizer.
fn pair() -> &'static Pair {
    static PAIR: OnceLock<Pair> = OnceLock::new();
    PAIR.get_or_init(|| {
        let path = common::default_model();
        let mut f = std::fs::File::open(&path).unwrap();
        let content = Content::read(&mut f).unwrap();
        assert_eq!(
            content.metadata["tokenizer.ggml.pre"].to_string().unwrap(),
            "smollm"
        );
        let vocab = Vocabulary::from_gguf(&path);
        Pair {
            ours: LoadedModel::load(&path).unwrap(),
            theirs: vocab.hf_tokenizer(),
        }
    })
}

/// Compares both tokenizers on `text`; returns a description of any disagreement.
fn check(text: &str) -> Option<String> {
    let p = pair();
    let ours = p.ours.tokenizer.encode(text, true).unwrap();
    let theirs = p.theirs.encode(text, false).unwrap().get_ids().to_vec();
    if ours != theirs {
        return Some(format!(
            "{text:?}: encode differs\n  ours:   {ours:?}\n  theirs: {theirs:?}"
        ));
    }
    let ours_text = p.ours.tokenizer.decode(&ours).unwrap();
    let theirs_text = p.theirs.decode(&theirs, false).unwrap();
    if ours_text != theirs_text || ours_text != text {
        return Some(format!(
            "{text:?}: decode differs\n  ours:   {ours_text:?}\n  theirs: {theirs_text:?}"
        ));
    }
    None
}

/// Checks every case and reports all disagreements at once.
fn check_all(cases: &[&str]) {
    let failures: Vec<String> = cases.iter().filter_map(|c| check(c)).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn ascii_prose() {
    check_all(&[
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "I'm sure you'll see it's what they've said we'd do.",
        "IT'S LOUD. DON'T SHOUT, WE'LL HEAR.",
        "Mr. O'Neil's cat -- a \"tabby\" -- sat (quietly) on the mat; then: left?!",
        "e-mail me at someone@example.com or visit https://example.org/a?b=c&d=e#f",
        "a",
        "!!!???...",
        "~`@#$%^&*()_+-=[]{}|\\:;'<>,./",
    ]);
}

#[test]
fn unicode_text() {
    check_all(&[
        "café naïve résumé Ångström façade",
        "日本語のテキストを分割する",
        "中文分词测试，标点符号。",
        "한국어 문장입니다",
        "Привет, мир! Ελληνικά κείμενα",
        "emoji 😀👍🏽 and a family 👨‍👩‍👧 and flags 🇫🇷🇯🇵",
        "combining: e\u{301} a\u{308} n\u{303}\u{0323}",
        "RTL: שלום עולם and مرحبا بالعالم",
        "zero\u{200b}width\u{200d}joiner\u{feff}bom",
        "\u{1F600}",
        "ⅷ ½ ¼ ∞ ≠ ≤ → ∑ √",
    ]);
}

#[test]
fn code() {
    check_all(&[
        "fn main() {\n    let x: Vec<u32> = (0..10).collect();\n    println!(\"{x:?}\");\n}\n",
        "impl<'a> Foo<'a> {\n    pub fn bar(&self) -> &'a str { self.0 }\n}",
        "def f(x):\n\tif x > 0:\n\t\treturn x ** 2\n\treturn -x\n",
        "class A:\n    def __init__(self):\n        self.d = {'k': [1, 2.5, None]}\n",
        "for (int i = 0; i < n; ++i) { a[i] += b[i] * 3; }",
        "    indented four\n        indented eight\n\t\ttabs\n",
        "x=1;y=2\nif(x==y){return;}",
        "// comment\n/* block */\n# python comment\n<!-- html -->",
    ]);
}

#[test]
fn whitespace_runs() {
    check_all(&[
        " ",
        "   ",
        "a  b   c    d",
        "\n",
        "\n\n\n",
        "a\n\nb\n\n\nc",
        " \n \n ",
        "trailing spaces   ",
        "   leading spaces",
        "tab\tseparated\t\tvalues",
        "\t \t \n\t",
        "windows\r\nline\r\nendings\r\n",
        "mixed \u{a0}nbsp\u{3000}ideographic space",
        "end with newline\n",
        "space before newline \nnext",
    ]);
}

#[test]
fn digits() {
    check_all(&[
        "0",
        "1234567890",
        "31415926535897932384626433832795",
        "3.14159 and -2.5e-10",
        "1,000,000.00 dollars",
        "year 2024, room 101, 7am",
        "x² + y³ = z⁴",
        "Arabic-Indic ٣٤٥ and Devanagari ४२ and Thai ๓",
        "fullwidth １２３",
        "v1.2.3-rc4",
        "a1b2c3",
    ]);
}

#[test]
fn special_tokens() {
    check_all(&[
        "<|im_start|>user\nhi<|im_end|>",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|>",
        "text<|endoftext|>more text",
        "<|im_start|><|im_end|><|im_start|>",
        " <|im_start|> spaced <|im_end|> ",
        "<|im_start",
        "<|im_end|",
        "<|im_start|user",
        "<repo_name>treegrpo<file_sep>src/lib.rs",
        "<jupyter_code>print(1)<jupyter_output>1",
    ]);
}

#[test]
fn empty_string() {
    check_all(&[""]);
    let p = pair();
    assert!(p.ours.tokenizer.encode("", true).unwrap().is_empty());
    assert_eq!(p.ours.tokenizer.decode(&[]).unwrap(), "");
}

/// Found by the `tokenizer` fuzz target: SmolLM2's vocabulary has no token for some
/// control bytes. Both tokenizers drop such a byte (HF's BPE has no unknown token to
/// give it) and agree on every other token; decoding gives the text without exactly
/// those bytes.
#[test]
fn bytes_the_vocabulary_lacks_are_dropped_by_both_tokenizers() {
    let p = pair();
    let alphabet = common::tiny::byte_chars();
    let missing: Vec<u8> = (0..=255u8)
        .filter(|&b| {
            p.ours
                .tokenizer
                .token_id(&alphabet[b as usize].to_string())
                .is_none()
        })
        .collect();
    // Six ASCII control bytes, bytes no UTF-8 text holds (c0, c1, f5–ff), and the
    // lead bytes of planes 4–11 (f1, f2), unassigned in Unicode: the default model is
    // pinned by checksum, so the list is exact.
    let expected = [
        0x04, 0x06, 0x13, 0x14, 0x16, 0x1d, 0xc0, 0xc1, 0xf1, 0xf2, 0xf5, 0xf6, 0xf7, 0xf8, 0xf9,
        0xfa, 0xfb, 0xfc, 0xfd, 0xfe, 0xff,
    ];
    assert_eq!(missing, expected, "bytes without a token: {missing:02x?}");
    let text: String = (0u8..0x80)
        .map(char::from)
        .chain("café 12 ✓".chars())
        .collect();
    let ours = p.ours.tokenizer.encode(&text, false).unwrap();
    let theirs = p
        .theirs
        .encode(text.as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(ours, theirs);
    let kept: String = text
        .chars()
        .filter(|c| !(c.is_ascii() && missing.contains(&(*c as u8))))
        .collect();
    assert_eq!(p.ours.tokenizer.decode(&ours).unwrap(), kept);
}

/// The special-token table itself: every control token encodes to its own id, alone.
#[test]
fn every_control_token_is_one_token() {
    let p = pair();
    for id in 0..17u32 {
        let text = p.theirs.id_to_token(id).unwrap();
        assert_eq!(p.ours.tokenizer.encode(&text, true).unwrap(), vec![id]);
    }
    assert_eq!(p.ours.tokenizer.token_id("<|im_end|>"), Some(2));
}

fn render(messages: &[ChatMessage]) -> String {
    let tmpl = pair().ours.chat_template.as_ref().unwrap();
    tmpl.render(messages, true).unwrap()
}

#[test]
fn chat_template_system_and_user() {
    let text = render(&[
        ChatMessage::new("system", "You are terse."),
        ChatMessage::new("user", "Hi there"),
    ]);
    assert_eq!(
        text,
        "<|im_start|>system\nYou are terse.<|im_end|>\n\
         <|im_start|>user\nHi there<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    assert!(check(&text).is_none(), "{:?}", check(&text));
}

#[test]
fn chat_template_user_only_gets_default_system_prompt() {
    let text = render(&[ChatMessage::new("user", "What is 2+2?")]);
    assert_eq!(
        text,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    // The prompt the engine feeds the model starts with <|im_start|> as one token.
    let ids = pair()
        .ours
        .chat_prompt(&[ChatMessage::new("user", "What is 2+2?")])
        .unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(pair().ours.tokenizer.decode(&ids).unwrap(), text);
}

#[test]
fn chat_template_without_generation_prompt() {
    let tmpl = pair().ours.chat_template.as_ref().unwrap();
    let text = tmpl
        .render(
            &[
                ChatMessage::new("system", "S"),
                ChatMessage::new("user", "U"),
                ChatMessage::new("assistant", "A"),
            ],
            false,
        )
        .unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
    );
}
