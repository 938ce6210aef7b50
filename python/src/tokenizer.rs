//! `treegrpo.Tokenizer`: the engine's tokenizer and chat template.

use std::sync::Arc;

use pyo3::prelude::*;
use treegrpo::model::{LoadedModel, TokenId};

use crate::convert;
use crate::errors::{model_error, value_error};

/// The model's tokenizer and its own chat template.
#[pyclass(module = "treegrpo._treegrpo", name = "Tokenizer", frozen)]
pub struct Tokenizer {
    model: Arc<LoadedModel>,
}

impl Tokenizer {
    pub fn new(model: Arc<LoadedModel>) -> Self {
        Tokenizer { model }
    }
}

#[pymethods]
impl Tokenizer {
    /// Token ids of `text`. With `add_special_tokens` a BOS comes first when the model
    /// wants one and special-token text (`<|im_start|>`) becomes its token, as
    /// `treegrpo generate --raw` encodes a prompt; without, the text is plain text.
    #[pyo3(signature = (text, add_special_tokens=true))]
    fn encode(&self, text: &str, add_special_tokens: bool) -> PyResult<Vec<TokenId>> {
        let t = &self.model.tokenizer;
        if add_special_tokens {
            t.encode_prompt(text)
        } else {
            t.encode(text, false)
        }
        .map_err(model_error)
    }

    /// The text of `token_ids` (special tokens included as their text).
    fn decode(&self, token_ids: &Bound<'_, PyAny>) -> PyResult<String> {
        let ids = convert::token_ids(token_ids)?;
        let vocab = self.vocab_size();
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(value_error(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        self.model.tokenizer.decode(&ids).map_err(model_error)
    }

    /// The model's chat template applied to `messages` (`[{"role", "content"}]`):
    /// token ids (with `tokenize`), else the text.
    #[pyo3(signature = (messages, add_generation_prompt=true, tokenize=true))]
    fn apply_chat_template<'py>(
        &self,
        py: Python<'py>,
        messages: &Bound<'py, PyAny>,
        add_generation_prompt: bool,
        tokenize: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let messages = convert::messages(messages)?;
        let template = self
            .model
            .chat_template
            .as_ref()
            .ok_or_else(|| value_error("this model has no chat template"))?;
        let text = template
            .render(&messages, add_generation_prompt)
            .map_err(model_error)?;
        if tokenize {
            let ids = self
                .model
                .tokenizer
                .encode_prompt(&text)
                .map_err(model_error)?;
            Ok(ids.into_pyobject(py)?.into_any())
        } else {
            Ok(text.into_pyobject(py)?.into_any())
        }
    }

    /// Tokens in the vocabulary.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.model.tokenizer.vocab_size()
    }

    /// The end-of-sequence token ids generation stops at.
    #[getter]
    fn eos_token_ids(&self) -> Vec<TokenId> {
        self.model.tokenizer.eos_ids().to_vec()
    }

    /// The beginning-of-sequence token id, if the model has one.
    #[getter]
    fn bos_token_id(&self) -> Option<TokenId> {
        self.model.tokenizer.bos()
    }
}
