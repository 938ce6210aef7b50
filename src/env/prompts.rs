//! System prompts: Search-R1's instruction text, adapted to a system
//! message, the configured tags and the turn limit. The question goes in the
//! user message; the integrator renders both with the model's chat template.

use crate::env::action_kind::ActionKind;
use crate::env::tags::Tags;
use crate::model::chat::ChatMessage;

fn turn_sentence(max_turns: usize, verb: &str, a: &str) -> String {
    match max_turns {
        0 => {
            format!("You cannot {verb} for this question: answer directly inside <{a}> and </{a}>.")
        }
        1 => format!("You can {verb} at most once; after that you must give the answer."),
        n => format!("You can {verb} at most {n} times; after that you must give the answer."),
    }
}

/// The search-qa system prompt (Search-R1's, plus the step format rule).
pub fn search_qa_system_prompt(tags: &Tags, max_turns: usize) -> String {
    let (t, s, a, i) = (&tags.think, &tags.search, &tags.answer, &tags.information);
    format!(
        "Answer the given question. You must conduct reasoning inside <{t}> and </{t}> first every time you get new information. \
After reasoning, if you find you lack some knowledge, you can call a search engine by <{s}> query </{s}> and it will return the top searched results between <{i}> and </{i}>. \
{turns} \
If you find no further external knowledge needed, you can directly provide the answer inside <{a}> and </{a}>, without detailed illustrations. For example, <{a}> Beijing </{a}>.\n\
Each of your turns is exactly one <{t}>...</{t}> block followed by exactly one <{s}>...</{s}> or <{a}>...</{a}>, with nothing after it.",
        turns = turn_sentence(max_turns, "search", a),
    )
}

/// The calculator system prompt.
pub fn calc_system_prompt(tags: &Tags, max_turns: usize) -> String {
    let (t, c, a, i) = (&tags.think, &tags.calc, &tags.answer, &tags.information);
    format!(
        "Solve the given arithmetic word problem. You must conduct reasoning inside <{t}> and </{t}> first every time you get new information. \
After reasoning, if you need to compute something, you can call a calculator by <{c}> expression </{c}> and it will return the result between <{i}> and </{i}>. \
The calculator accepts only numbers, + - * /, and parentheses, for example <{c}> (12 + 30) * 4 </{c}>. \
{turns} \
When you know the result, provide the final answer as a number only inside <{a}> and </{a}>. For example, <{a}> 42 </{a}>.\n\
Each of your turns is exactly one <{t}>...</{t}> block followed by exactly one <{c}>...</{c}> or <{a}>...</{a}>, with nothing after it.",
        turns = turn_sentence(max_turns, "calculate", a),
    )
}

/// The system prompt for an environment offering `tool`.
pub fn system_prompt(tool: ActionKind, tags: &Tags, max_turns: usize) -> String {
    match tool {
        ActionKind::Calc => calc_system_prompt(tags, max_turns),
        _ => search_qa_system_prompt(tags, max_turns),
    }
}

/// The first chat messages of an episode: system prompt, then the question.
pub fn initial_messages(
    tool: ActionKind,
    tags: &Tags,
    max_turns: usize,
    question: &str,
) -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", system_prompt(tool, tags, max_turns)),
        ChatMessage::new("user", format!("Question: {}", question.trim())),
    ]
}
