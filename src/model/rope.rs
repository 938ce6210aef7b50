//! RoPE's frequencies: the base `theta`, the long-context rescaling a checkpoint
//! declares (HF's `rope_type`), and the one function that turns them into the inverse
//! frequencies every forward (the engine's, the trainer's, the candle oracle's)
//! rotates by.
//!
//! A checkpoint names its RoPE in one of two ways: transformers 5 writes
//! `rope_parameters: {"rope_type": ..., "rope_theta": ..., <scaling fields>}`; older
//! files have a top-level `rope_theta` and an optional `rope_scaling` object. Both are
//! read here. A `rope_type` we do not implement is refused, never replaced by the
//! default: a wrong frequency gives plausible but wrong logits with no error.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// RoPE's base when a checkpoint names none (HF's default).
pub const DEFAULT_THETA: f32 = 10_000.0;

/// How RoPE's frequencies are rescaled (HF's `rope_type`).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "lowercase")]
pub enum RopeScaling {
    /// `1 / theta^(2i/d)`, unscaled.
    #[default]
    Default,
    /// Llama 3.1's: low frequencies divided by `factor`, high ones kept, a smooth
    /// blend between (transformers' `_compute_llama3_parameters`).
    Llama3 {
        /// How much longer the new context is than the original: low frequencies are divided
        /// by it.
        factor: f32,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` positions
        /// are fully rescaled.
        low_freq_factor: f32,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` positions
        /// are kept as they are.
        high_freq_factor: f32,
        /// The context window, in tokens, the model was pretrained with.
        original_max_position_embeddings: usize,
    },
}

/// The inverse frequencies of one head width: `head_dim / 2` values, computed in f32
/// in HF's order of operations, so angles agree with transformers' to the last bit.
pub fn inverse_frequencies(head_dim: usize, theta: f32, scaling: &RopeScaling) -> Vec<f32> {
    let plain = (0..head_dim)
        .step_by(2)
        .map(|i| 1f32 / theta.powf(i as f32 / head_dim as f32));
    match *scaling {
        RopeScaling::Default => plain.collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let old_context = original_max_position_embeddings as f32;
            let low_freq_wavelen = old_context / low_freq_factor;
            let high_freq_wavelen = old_context / high_freq_factor;
            plain
                .map(|f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    if wavelen < high_freq_wavelen {
                        f
                    } else if wavelen > low_freq_wavelen {
                        f / factor
                    } else {
                        let smooth = (old_context / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}

/// A checkpoint's RoPE fields that cannot be served as they are.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RopeConfigError {
    /// The checkpoint names a `rope_type` other than `default` and `llama3`.
    #[error("rope_type '{0}' is not supported (supported: default, llama3)")]
    UnsupportedType(String),
    /// A RoPE field is missing, not a number, or out of range.
    #[error("{field}: {problem}")]
    BadField {
        /// The field's path in `config.json`, e.g. `rope_scaling.factor`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The top-level `rope_theta` and the one in `rope_parameters` disagree.
    #[error("rope_theta is {top_level} at the top level but {in_parameters} in rope_parameters")]
    ConflictingTheta {
        /// The top-level `rope_theta`.
        top_level: f32,
        /// `rope_parameters.rope_theta`.
        in_parameters: f32,
    },
}

fn bad(field: &str, problem: impl Into<String>) -> RopeConfigError {
    RopeConfigError::BadField {
        field: field.to_string(),
        problem: problem.into(),
    }
}

/// `theta` and the scaling a `config.json` declares: its top-level `rope_theta`,
/// `rope_parameters` (transformers 5) and `rope_scaling` (transformers 4), any of
/// which may be absent.
pub fn from_hf_config(
    rope_theta: Option<f32>,
    rope_parameters: Option<&Value>,
    rope_scaling: Option<&Value>,
) -> Result<(f32, RopeScaling), RopeConfigError> {
    let params = rope_parameters.filter(|v| !v.is_null());
    let theta_in_params = match params.and_then(|p| p.get("rope_theta")) {
        None => None,
        Some(v) => Some(
            v.as_f64()
                .ok_or_else(|| bad("rope_parameters.rope_theta", "not a number"))?
                as f32,
        ),
    };
    let theta = match (rope_theta, theta_in_params) {
        (Some(a), Some(b)) if a != b => {
            return Err(RopeConfigError::ConflictingTheta {
                top_level: a,
                in_parameters: b,
            })
        }
        (a, b) => b.or(a).unwrap_or(DEFAULT_THETA),
    };
    if !(theta.is_finite() && theta > 0.0) {
        return Err(bad("rope_theta", format!("{theta} is not positive")));
    }
    // transformers 5 keeps the scaling fields beside the theta; transformers 4 in
    // `rope_scaling`. Either may say `type` instead of `rope_type` (older files).
    let (scaling, name) = match (params, rope_scaling.filter(|v| !v.is_null())) {
        (Some(p), _) if p.get("rope_type").is_some() || p.get("type").is_some() => {
            (p, "rope_parameters")
        }
        (_, Some(s)) => (s, "rope_scaling"),
        (Some(p), None) => (p, "rope_parameters"),
        (None, None) => return Ok((theta, RopeScaling::Default)),
    };
    if !scaling.is_object() {
        return Err(bad(name, "not an object"));
    }
    let kind = scaling
        .get("rope_type")
        .or_else(|| scaling.get("type"))
        .map(|v| {
            v.as_str()
                .ok_or_else(|| bad(name, "rope_type is not a string"))
        })
        .transpose()?
        .unwrap_or("default");
    let number = |field: &str| -> Result<f64, RopeConfigError> {
        let path = format!("{name}.{field}");
        let v = scaling
            .get(field)
            .ok_or_else(|| bad(&path, "missing (llama3 scaling needs it)"))?
            .as_f64()
            .ok_or_else(|| bad(&path, "not a number"))?;
        if v.is_finite() && v > 0.0 {
            Ok(v)
        } else {
            Err(bad(&path, format!("{v} is not positive")))
        }
    };
    match kind {
        "default" => Ok((theta, RopeScaling::Default)),
        "llama3" => {
            let low_freq_factor = number("low_freq_factor")? as f32;
            let high_freq_factor = number("high_freq_factor")? as f32;
            if high_freq_factor <= low_freq_factor {
                return Err(bad(
                    &format!("{name}.high_freq_factor"),
                    format!("{high_freq_factor} must exceed low_freq_factor ({low_freq_factor})"),
                ));
            }
            Ok((
                theta,
                RopeScaling::Llama3 {
                    factor: number("factor")? as f32,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings: number("original_max_position_embeddings")?
                        as usize,
                },
            ))
        }
        other => Err(RopeConfigError::UnsupportedType(other.to_string())),
    }
}

/// The `rope_parameters` object transformers 5 writes for `theta` and `scaling`
/// (our checkpoints write it beside the older `rope_theta` / `rope_scaling`).
pub fn to_hf_parameters(theta: f32, scaling: &RopeScaling) -> Value {
    let mut v = serde_json::to_value(scaling).unwrap_or(Value::Null);
    if let Value::Object(o) = &mut v {
        o.insert("rope_theta".into(), serde_json::json!(theta));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn transformers_5_parameters_set_theta() {
        let p = json!({"rope_type": "default", "rope_theta": 1_000_000.0});
        assert_eq!(
            from_hf_config(None, Some(&p), None).unwrap(),
            (1e6, RopeScaling::Default)
        );
        // The older top-level field alone, and nothing at all.
        assert_eq!(
            from_hf_config(Some(5e5), None, None).unwrap(),
            (5e5, RopeScaling::Default)
        );
        assert_eq!(
            from_hf_config(None, None, Some(&Value::Null)).unwrap(),
            (DEFAULT_THETA, RopeScaling::Default)
        );
    }

    #[test]
    fn llama3_scaling_is_read_from_either_place() {
        let fields = json!({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let want = RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        assert_eq!(
            from_hf_config(Some(5e5), None, Some(&fields)).unwrap(),
            (5e5, want)
        );
        let mut p = fields.clone();
        p["rope_theta"] = json!(5e5);
        assert_eq!(from_hf_config(None, Some(&p), None).unwrap(), (5e5, want));
        // What we write reads back the same.
        assert_eq!(
            from_hf_config(None, Some(&to_hf_parameters(5e5, &want)), None).unwrap(),
            (5e5, want)
        );
    }

    #[test]
    fn unknown_types_and_conflicts_are_refused() {
        for t in ["yarn", "linear", "dynamic", "longrope"] {
            let p = json!({"rope_type": t, "rope_theta": 1e4, "factor": 2.0});
            assert_eq!(
                from_hf_config(None, Some(&p), None),
                Err(RopeConfigError::UnsupportedType(t.into()))
            );
            let s = json!({"type": t, "factor": 2.0});
            assert!(from_hf_config(Some(1e4), None, Some(&s)).is_err());
        }
        let p = json!({"rope_type": "default", "rope_theta": 1e6});
        assert!(matches!(
            from_hf_config(Some(1e4), Some(&p), None),
            Err(RopeConfigError::ConflictingTheta { .. })
        ));
        let missing = json!({"rope_type": "llama3", "factor": 8.0});
        assert!(from_hf_config(Some(1e4), Some(&missing), None)
            .unwrap_err()
            .to_string()
            .contains("low_freq_factor"));
    }

    /// Hand-computed from transformers' formula for Llama 3.1 (theta 5e5, factor 8,
    /// low 1, high 4, old context 8192), head_dim 128: the first frequency is high
    /// (wavelength 2π < 2048: kept), the last is low (divided by 8), and one between
    /// is blended.
    #[test]
    fn llama3_frequencies_match_the_formula() {
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let plain = inverse_frequencies(128, 5e5, &RopeScaling::Default);
        let scaled = inverse_frequencies(128, 5e5, &s);
        assert_eq!(scaled[0], plain[0]);
        assert_eq!(scaled[63], plain[63] / 8.0);
        let two_pi = 2.0 * std::f32::consts::PI;
        let mut blended = 0;
        for (i, (&p, &q)) in plain.iter().zip(&scaled).enumerate() {
            let wavelen = two_pi / p;
            if (2048.0..=8192.0).contains(&wavelen) {
                let smooth = (8192.0 / wavelen - 1.0) / 3.0;
                assert_eq!(q, (1.0 - smooth) * p / 8.0 + smooth * p, "frequency {i}");
                assert!(q < p && q > p / 8.0);
                blended += 1;
            }
        }
        assert!(blended > 0);
    }
}
