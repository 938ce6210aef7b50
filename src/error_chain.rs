//! An error and its causes as one line: the error's own message, then each
//! [`source`](std::error::Error::source)'s, `: `-joined. Every layer's error keeps
//! its cause as a source, not in its message, so this is how the whole story reaches
//! a reader that is not a Rust chain printer: the server's error bodies, Python's
//! exception text, a failed tool's observation.

use std::error::Error;

/// `e`'s message followed by its causes (`"forward failed: KV store: KV pool out of
/// blocks: …"`). A cause whose text the line already holds is not repeated (a
/// foreign error may print its own source).
pub fn error_chain(e: &dyn Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn the_causes_follow_the_message_once() {
        let e = Outer(std::io::Error::other("disk on fire"));
        assert_eq!(error_chain(&e), "outer: disk on fire");
    }
}
