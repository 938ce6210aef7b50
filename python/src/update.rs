//! `treegrpo.update`: one policy-gradient update of a model on trajectories (the
//! dicts `treegrpo.rollout` returns, or a `trajectories.jsonl` path), written as an
//! HF checkpoint — what `treegrpo update` does, with the same defaults.

use std::path::{Path, PathBuf};
use std::time::Instant;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use treegrpo::model::LoadedModel;
use treegrpo::train::input::parse_trajectories;
use treegrpo::train::{
    update_checkpoint, LossAgg, LossConfig, OptimizerConfig, OptimizerKind, UpdateConfig,
};

use crate::convert;
use crate::errors::{model_error, train_error, value_error};

/// The loss and optimiser options, by the names of `treegrpo update`'s flags.
pub(crate) fn configs(
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<(OptimizerConfig, UpdateConfig)> {
    let mut opt = OptimizerConfig::default();
    let mut upd = UpdateConfig::default();
    let mut loss = LossConfig::default();
    let Some(options) = options else {
        return Ok((opt, upd));
    };
    for (key, value) in options.iter() {
        let key: String = key.extract()?;
        let bad = |e: PyErr| value_error(format!("{key}: {e}"));
        let number = |v: &Bound<'_, PyAny>| -> PyResult<f64> {
            let x: f64 = v.extract().map_err(bad)?;
            if x.is_finite() && x >= 0.0 {
                Ok(x)
            } else {
                Err(value_error(format!(
                    "{key} must be a non-negative number, not {x}"
                )))
            }
        };
        match key.as_str() {
            "lr" => opt.lr = number(&value)?,
            "weight_decay" => opt.weight_decay = number(&value)?,
            "warmup_steps" => opt.warmup_steps = value.extract().map_err(bad)?,
            "optimizer" => {
                let s: String = value.extract().map_err(bad)?;
                opt.kind = s
                    .parse::<OptimizerKind>()
                    .map_err(|e| value_error(format!("optimizer: {e}")))?;
            }
            "clip_low" => loss.clip_low = number(&value)?,
            "clip_high" => loss.clip_high = number(&value)?,
            "clip_c" => loss.clip_c = number(&value)?,
            "kl_coef" => loss.kl_coef = number(&value)?,
            "entropy_coef" => loss.entropy_coef = number(&value)?,
            "tis_cap" => loss.tis_cap = number(&value)?,
            "loss_agg" => {
                let s: String = value.extract().map_err(bad)?;
                loss.agg = s
                    .parse::<LossAgg>()
                    .map_err(|e| value_error(format!("loss_agg: {e}")))?;
            }
            "max_grad_norm" => upd.max_grad_norm = number(&value)?,
            "packed" => upd.packed = value.extract().map_err(bad)?,
            "micro_batch_tokens" => {
                upd.micro_batch_tokens = value.extract().map_err(bad)?;
                if upd.micro_batch_tokens == 0 {
                    return Err(value_error("micro_batch_tokens must be at least 1"));
                }
            }
            _ => {
                return Err(value_error(format!(
                    "unknown update option {key:?} (lr, optimizer, weight_decay, warmup_steps, \
                     clip_low, clip_high, clip_c, loss_agg, kl_coef, entropy_coef, tis_cap, \
                     max_grad_norm, packed, micro_batch_tokens)"
                )))
            }
        }
    }
    upd.loss = loss;
    Ok((opt, upd))
}

/// The trajectories as `trajectories.jsonl` text, and the name errors cite.
fn trajectories_text(value: &Bound<'_, PyAny>) -> PyResult<(String, PathBuf)> {
    if let Ok(path) = value.extract::<PathBuf>() {
        if value.cast::<PyString>().is_ok() || value.hasattr("__fspath__")? {
            let text = std::fs::read_to_string(&path).map_err(|e| {
                pyo3::exceptions::PyOSError::new_err(format!("{}: {e}", path.display()))
            })?;
            return Ok((text, path));
        }
    }
    let mut text = String::new();
    for record in value.try_iter().map_err(|_| {
        value_error("trajectories must be a list of trajectory dicts or a trajectories.jsonl path")
    })? {
        text.push_str(
            &serde_json::to_string(&convert::from_python(&record?)?)
                .map_err(|e| value_error(format!("a trajectory is not JSON: {e}")))?,
        );
        text.push('\n');
    }
    Ok((text, PathBuf::from("<trajectories>")))
}

/// Updates the model at `model_path` (None: the default model) and writes the new
/// checkpoint to `out_dir`; returns `treegrpo update`'s metrics line as a dict.
#[pyfunction]
#[pyo3(signature = (model_path, trajectories, out_dir, **options))]
pub fn update<'py>(
    py: Python<'py>,
    model_path: Option<PathBuf>,
    trajectories: &Bound<'py, PyAny>,
    out_dir: PathBuf,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let t0 = Instant::now();
    let (optimizer, update) = configs(options)?;
    let (text, source) = trajectories_text(trajectories)?;
    // The update is one long computation with no point to stop at: it runs to its end
    // with the GIL released (Ctrl-C is seen once it returns).
    let report = py.detach(move || -> PyResult<_> {
        let path = treegrpo::model::fetch::model_path_or_default(model_path.as_deref(), &mut |m| {
            eprintln!("{m}")
        })
        .map_err(model_error)?;
        let model = LoadedModel::load(&path).map_err(model_error)?;
        let data = parse_trajectories(&text, &source, model.model.config()).map_err(train_error)?;
        update_checkpoint(
            model,
            &path,
            &data,
            optimizer,
            update,
            Path::new(&out_dir),
            &mut |_| {},
        )
        .map_err(train_error)
    })?;
    let out = convert::to_python(py, &report.metrics)?;
    out.set_item("step", report.step)?;
    out.set_item("update_seconds", report.metrics.seconds)?;
    out.set_item("seconds", t0.elapsed().as_secs_f64())?;
    Ok(out)
}
