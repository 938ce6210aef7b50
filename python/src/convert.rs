//! Conversions at the Python boundary: prompts (text or token ids), chat messages,
//! and JSON-shaped values (the library's export records reach Python as the same
//! dicts `trajectories.jsonl` holds, through `json`).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use serde::Serialize;
use treegrpo::model::{ChatMessage, LoadedModel, TokenId};

use crate::errors::{model_error, value_error};

/// One prompt: text (encoded as `treegrpo generate --raw` encodes it: a BOS first
/// when the model wants one) or token ids.
pub fn prompt_ids(model: &LoadedModel, prompt: &Bound<'_, PyAny>) -> PyResult<Vec<TokenId>> {
    if let Ok(text) = prompt.cast::<PyString>() {
        let ids = model
            .tokenizer
            .encode_prompt(&text.to_cow()?)
            .map_err(model_error)?;
        return Ok(ids);
    }
    token_ids(prompt)
}

/// A sequence of token ids; a negative or too large id is a `ValueError`.
pub fn token_ids(value: &Bound<'_, PyAny>) -> PyResult<Vec<TokenId>> {
    if value.cast::<PyString>().is_ok() {
        return Err(value_error("expected a list of token ids, got a string"));
    }
    let mut ids = Vec::new();
    for item in value
        .try_iter()
        .map_err(|_| value_error("expected a list of token ids"))?
    {
        let item = item?;
        let id: i64 = item
            .extract()
            .map_err(|_| value_error(format!("token ids must be integers, got {item}")))?;
        let id = TokenId::try_from(id)
            .map_err(|_| value_error(format!("token id {id} is not a valid id")))?;
        ids.push(id);
    }
    Ok(ids)
}

/// Several prompts: a list of texts or of token-id lists (a single text or a single
/// id list is one prompt).
pub fn prompts(model: &LoadedModel, value: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<TokenId>>> {
    if value.cast::<PyString>().is_ok() {
        return Ok(vec![prompt_ids(model, value)?]);
    }
    let list = value
        .cast::<PyList>()
        .map_err(|_| value_error("prompts must be a list of strings or of token-id lists"))?;
    let single = !list.is_empty() && list.iter().all(|x| x.extract::<i64>().is_ok());
    if single {
        return Ok(vec![token_ids(value)?]);
    }
    list.iter().map(|p| prompt_ids(model, &p)).collect()
}

/// Chat messages: a list of `{"role": str, "content": str}` dicts.
pub fn messages(value: &Bound<'_, PyAny>) -> PyResult<Vec<ChatMessage>> {
    let list = value
        .cast::<PyList>()
        .map_err(|_| value_error("messages must be a list of {'role', 'content'} dicts"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let dict = m
            .cast::<PyDict>()
            .map_err(|_| value_error(format!("message {i} is not a dict")))?;
        let field = |name: &str| -> PyResult<String> {
            dict.get_item(name)?
                .ok_or_else(|| value_error(format!("message {i} has no {name:?}")))?
                .extract::<String>()
                .map_err(|_| value_error(format!("message {i}: {name:?} must be a string")))
        };
        out.push(ChatMessage::new(field("role")?, field("content")?));
    }
    Ok(out)
}

/// A serialisable value as Python objects (dicts, lists, numbers, strings).
pub fn to_python<'py>(py: Python<'py>, value: &impl Serialize) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value)
        .map_err(|e| value_error(format!("cannot serialise a result: {e}")))?;
    py.import("json")?.call_method1("loads", (text,))
}

/// A Python value (JSON-serialisable) as a `serde_json::Value`.
pub fn from_python(value: &Bound<'_, PyAny>) -> PyResult<serde_json::Value> {
    let text: String = value
        .py()
        .import("json")?
        .call_method1("dumps", (value,))
        .map_err(|e| value_error(format!("not JSON-serialisable: {e}")))?
        .extract()?;
    serde_json::from_str(&text).map_err(|e| value_error(format!("not JSON: {e}")))
}
