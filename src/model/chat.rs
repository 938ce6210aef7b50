//! Chat messages and the model's own chat template, rendered by a real Jinja engine
//! (`minijinja`) so any model's template works, not only ChatML.

use minijinja::{context, Environment, Error as JinjaError, ErrorKind};
use serde::{Deserialize, Serialize};

use super::error::ModelError;

/// One chat turn as the template consumes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who speaks: `system`, `user`, `assistant` or `tool`, as the template expects.
    pub role: String,
    /// The turn's text.
    pub content: String,
}

impl ChatMessage {
    /// A turn of `role` saying `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template plus the special-token texts templates refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    /// The Jinja source, kept so a checkpoint can write it back out.
    source: String,
}

const TEMPLATE_NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles `source`; a syntax error is reported now, not at first use.
    pub fn new(source: &str, bos: String, eos: String) -> Result<Self, ModelError> {
        let mut env = Environment::new();
        // HF templates are written against Python's Jinja: `.strip()`, `.startswith()`…
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, JinjaError> {
                Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(ModelError::Template)?;
        Ok(ChatTemplate {
            env,
            bos,
            eos,
            source: source.to_string(),
        })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders the conversation; with `add_generation_prompt` the text ends where the
    /// assistant's reply begins.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(ModelError::Template)?;
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos,
            eos_token => self.eos,
        })
        .map_err(ModelError::Template)
    }
}
