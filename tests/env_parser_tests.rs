//! Action parser and step-format tests, plus a seeded fuzz loop.

use treegrpo::env::action::{parse_action, Action, InvalidReason};
use treegrpo::env::format::{check_step_format, FormatIssue};
use treegrpo::env::tags::Tags;
use treegrpo::env::ActionKind;

fn s(x: &str) -> String {
    x.to_owned()
}

fn invalid(r: InvalidReason) -> Action {
    Action::Invalid(r)
}

#[test]
fn parser_table() {
    use ActionKind::*;
    let t = Tags::default();
    let noise: String = "lorem <ipsum> dolor </sit> amet < > ".repeat(300); // ~10 kB
    let noise_then_action = format!("{noise}<think>ok</think><answer>42</answer>");
    let cases: Vec<(&str, &str, Action)> = vec![
        (
            "well formed search",
            "<think>x</think>\n<search> capital of France </search>",
            Action::Search(s("capital of France")),
        ),
        (
            "well formed answer",
            "<think>x</think><answer> Paris </answer>",
            Action::Answer(s("Paris")),
        ),
        (
            "calc",
            "<think>x</think><calc>1 + 2</calc>",
            Action::Calc(s("1 + 2")),
        ),
        (
            "missing closing tag",
            "<think>x</think><search>foo",
            invalid(InvalidReason::Unclosed { kind: Search }),
        ),
        (
            "mismatched closing tag",
            "<search>q</answer>",
            invalid(InvalidReason::Unclosed { kind: Search }),
        ),
        (
            "nested tags",
            "<think>x</think><search><answer>x</answer></search>",
            invalid(InvalidReason::NestedTag { kind: Search }),
        ),
        (
            "think tag inside answer",
            "<answer>a <think>b c</answer>",
            invalid(InvalidReason::NestedTag { kind: Answer }),
        ),
        // Parsing starts after the first </think>, wherever it is.
        (
            "closing think inside answer",
            "<answer>a <think>b</think> c</answer>",
            invalid(InvalidReason::NoAction),
        ),
        (
            "two actions, first wins",
            "<think>x</think><search>a</search><answer>b</answer>",
            Action::Search(s("a")),
        ),
        (
            "two actions, answer first",
            "<answer>b</answer><search>a</search>",
            Action::Answer(s("b")),
        ),
        (
            "empty query",
            "<think>x</think><search>   </search>",
            invalid(InvalidReason::Empty { kind: Search }),
        ),
        (
            "empty answer",
            "<answer></answer>",
            invalid(InvalidReason::Empty { kind: Answer }),
        ),
        (
            "unicode",
            "<think>ü</think><search>Zürich 東京 🚀</search>",
            Action::Search(s("Zürich 東京 🚀")),
        ),
        (
            "no tags",
            "I think the answer is Paris.",
            invalid(InvalidReason::NoAction),
        ),
        ("empty text", "", invalid(InvalidReason::NoAction)),
        (
            "tag inside think is skipped",
            "<think>I could <search>x</search></think><answer>y</answer>",
            Action::Answer(s("y")),
        ),
        (
            "unclosed think, lenient like Search-R1",
            "<think>hmm <search>q</search>",
            Action::Search(s("q")),
        ),
        (
            "prefilled think",
            "reasoning...</think>\n<answer>x</answer>",
            Action::Answer(s("x")),
        ),
        (
            "stray close before open",
            "</search><search>q</search>",
            Action::Search(s("q")),
        ),
        (
            "regex semantics: unclosed then complete",
            "<search>foo <answer>bar</answer>",
            Action::Answer(s("bar")),
        ),
        (
            "upper case is not a tag",
            "<SEARCH>q</SEARCH>",
            invalid(InvalidReason::NoAction),
        ),
        (
            "multiline content",
            "<answer>\n  two\n  lines \n</answer>",
            Action::Answer(s("two\n  lines")),
        ),
        ("10 kB of noise", &noise, invalid(InvalidReason::NoAction)),
        (
            "10 kB of noise then an action",
            &noise_then_action,
            Action::Answer(s("42")),
        ),
    ];
    for (name, text, want) in cases {
        assert_eq!(parse_action(text, &t), want, "case {name:?}");
    }
}

#[test]
fn custom_tags() {
    let t = Tags {
        search: s("tool"),
        answer: s("final"),
        ..Tags::default()
    };
    assert!(t.validate().is_ok());
    assert_eq!(
        parse_action("<think>a</think><tool>q</tool>", &t),
        Action::Search(s("q"))
    );
    assert_eq!(parse_action("<final>x</final>", &t), Action::Answer(s("x")));
    assert_eq!(
        parse_action("<search>q</search>", &t),
        Action::Invalid(InvalidReason::NoAction)
    );
}

#[test]
fn tags_validation() {
    let bad = [
        Tags {
            search: s(""),
            ..Tags::default()
        },
        Tags {
            search: s("se arch"),
            ..Tags::default()
        },
        Tags {
            search: s("a>b"),
            ..Tags::default()
        },
        Tags {
            calc: s("answer"),
            ..Tags::default()
        },
    ];
    for t in bad {
        assert!(t.validate().is_err(), "{t:?} should be rejected");
    }
    assert!(Tags::default().validate().is_ok());
}

#[test]
fn step_format_table() {
    let t = Tags::default();
    let cases: Vec<(&str, Result<(), FormatIssue>)> = vec![
        ("<think>x</think><search>q</search>", Ok(())),
        ("  <think>x</think>\n\n<answer>y</answer>\n", Ok(())),
        ("<search>q</search>", Err(FormatIssue::MissingThink)),
        (
            "hello <think>x</think><search>q</search>",
            Err(FormatIssue::MissingThink),
        ),
        (
            "<think>x <search>q</search>",
            Err(FormatIssue::UnclosedThink),
        ),
        (
            "<think>x <answer>no</answer></think><search>q</search>",
            Err(FormatIssue::TagInThink),
        ),
        (
            "<think>x</think> I will search. <search>q</search>",
            Err(FormatIssue::TextBeforeAction),
        ),
        (
            "<think>x</think><search>q</search> and more",
            Err(FormatIssue::TextAfterAction),
        ),
        (
            "<think>x</think><search>a</search><answer>b</answer>",
            Err(FormatIssue::TextAfterAction),
        ),
        (
            "<think>x</think><search>  </search>",
            Err(FormatIssue::InvalidAction(InvalidReason::Empty {
                kind: ActionKind::Search,
            })),
        ),
    ];
    for (text, want) in cases {
        let action = parse_action(text, &t);
        assert_eq!(check_step_format(text, &t, &action), want, "text {text:?}");
    }
}

/// xorshift64*: a tiny seeded RNG for the fuzz loop.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn fuzz_parser_never_panics() {
    const FRAGMENTS: &[&str] = &[
        "<think>",
        "</think>",
        "<search>",
        "</search>",
        "<answer>",
        "</answer>",
        "<calc>",
        "</calc>",
        "<information>",
        "</information>",
        "<",
        ">",
        "/",
        "</",
        "<sea",
        "rch>",
        " ",
        "\n",
        "q",
        "Paris",
        "é",
        "東京",
        "🚀",
        "\u{0}",
        "\u{200d}",
        "\u{feff}",
        "\r\n",
        "ß",
        "ﬃ",
        "İ",
    ];
    let t = Tags::default();
    let markers = t.markers();
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    for _ in 0..5000 {
        let mut text = String::new();
        for _ in 0..rng.below(40) {
            if rng.below(5) == 0 {
                // A random scalar value, surrogates skipped.
                let c = char::from_u32(rng.below(0x11_0000) as u32).unwrap_or('?');
                text.push(c);
            } else {
                text.push_str(FRAGMENTS[rng.below(FRAGMENTS.len())]);
            }
        }
        let action = parse_action(&text, &t);
        assert_eq!(action, parse_action(&text, &t), "deterministic");
        if let Some(content) = action.content() {
            assert!(!content.is_empty() && content == content.trim(), "{text:?}");
            assert!(
                markers.iter().all(|m| !content.contains(m.as_str())),
                "{text:?}"
            );
        }
        // The format check must not panic either, and never passes an invalid action.
        let fmt = check_step_format(&text, &t, &action);
        assert!(action.is_valid() || fmt.is_err());
    }
}

#[test]
fn fuzz_well_formed_steps_round_trip() {
    let t = Tags::default();
    let mut rng = XorShift(42);
    let words = ["alpha", "Zürich", "東京", "1 + 2", "a<b", "x > y", "🚀"];
    for _ in 0..2000 {
        let thought = words[rng.below(words.len())];
        let content = words[rng.below(words.len())];
        let kind = [ActionKind::Search, ActionKind::Answer, ActionKind::Calc][rng.below(3)];
        let tag = t.action(kind);
        let text = format!("<think>{thought}</think>\n<{tag}> {content} </{tag}>");
        let action = parse_action(&text, &t);
        assert_eq!(action.kind(), Some(kind), "{text:?}");
        assert_eq!(action.content(), Some(content));
        assert_eq!(check_step_format(&text, &t, &action), Ok(()), "{text:?}");
    }
}
