//! `Engine.load_state_dict`'s input: a mapping of HF parameter names to torch tensors
//! or numpy arrays, read straight from their memory into candle tensors.
//!
//! abi3 for Python 3.9 has no buffer protocol, so a tensor's bytes are found the way
//! its own library publishes them (torch's `data_ptr()`, numpy's
//! `__array_interface__`) and copied once, under the GIL, into the candle tensor the
//! model is built from: no numpy round trip (torch's bf16 has no numpy dtype, and its
//! raw bits are exactly candle's bf16) and no file. A non-contiguous tensor is made
//! contiguous by its own library first; a tensor on an accelerator is copied to the
//! CPU by torch.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::errors::value_error;

/// The name transformers gives the output layer, and the embedding it may be tied to.
const HEAD: &str = "lm_head.weight";
const EMBEDDING: &str = "model.embed_tokens.weight";

/// One tensor's memory as its library lays it out: C-contiguous, on the CPU.
struct Raw<'py> {
    /// Holds the memory alive while it is read.
    _owner: Bound<'py, PyAny>,
    address: usize,
    dims: Vec<usize>,
    dtype: DType,
}

impl Raw<'_> {
    fn bytes(&self) -> usize {
        self.dims.iter().product::<usize>() * self.dtype.size_in_bytes()
    }

    /// Copies the values into a candle tensor.
    fn to_tensor(&self, name: &str) -> PyResult<Tensor> {
        let n = self.bytes();
        let bytes: &[u8] = if n == 0 {
            &[]
        } else {
            if self.address == 0 {
                return Err(value_error(format!("{name}: the tensor has no data")));
            }
            // SAFETY: `_owner` (a contiguous CPU tensor or array, referenced for as long
            // as `self` lives) owns `n` bytes from `address`: its library reported the
            // address, the element type and the dims, and contiguity was asked of it.
            // The GIL is held, so no Python code frees or resizes it meanwhile.
            unsafe { std::slice::from_raw_parts(self.address as *const u8, n) }
        };
        let t = Tensor::from_raw_buffer(bytes, self.dtype, &self.dims, &Device::Cpu)
            .map_err(|e| value_error(format!("{name}: {e}")))?;
        Ok(t)
    }
}

/// The tensors of `state` (a mapping of names to torch tensors or numpy arrays) as
/// candle tensors by name, read one at a time (a tensor that had to be made
/// contiguous or copied off an accelerator is let go before the next is read). When
/// `tied` (the served model ties its output layer to the embedding) an
/// `lm_head.weight` that *is* the embedding's tensor is left out instead of being
/// copied and compared.
pub fn tensors(state: &Bound<'_, PyAny>, tied: bool) -> PyResult<HashMap<String, Tensor>> {
    let items = state.call_method0("items").map_err(|_| {
        value_error(format!(
            "a state dict must be a mapping of parameter names to tensors, got {}",
            type_name(state)
        ))
    })?;
    let mut named: Vec<(String, Bound<'_, PyAny>)> = Vec::new();
    for item in items.try_iter()? {
        let item = item?;
        let (name, value): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item.extract()?;
        let name: String = name.extract().map_err(|_| {
            value_error(format!(
                "state dict keys must be strings, got {}",
                type_name(&name)
            ))
        })?;
        named.push((name, value));
    }
    let value_of = |wanted: &str| named.iter().find(|(n, _)| n == wanted).map(|(_, v)| v);
    let head_is_embedding = match (tied, value_of(HEAD), value_of(EMBEDDING)) {
        (true, Some(head), Some(embedding)) => {
            let head = identity(head);
            head.is_some() && head == identity(embedding)
        }
        _ => false,
    };
    let mut out = HashMap::with_capacity(named.len());
    for (name, value) in named {
        if head_is_embedding && name == HEAD {
            continue;
        }
        let tensor = raw(&name, &value)?.to_tensor(&name)?;
        out.insert(name, tensor);
    }
    Ok(out)
}

/// Where a tensor's values live and how they are laid out: address, shape, strides,
/// dtype (and device).
type Identity = (usize, Vec<usize>, Vec<isize>, String);

/// A torch tensor's or numpy array's [`Identity`]: equal for two names of one tensor,
/// as transformers' `state_dict()` gives a tied head. `None` for anything else (which
/// [`raw`] then refuses with its reason).
fn identity(value: &Bound<'_, PyAny>) -> Option<Identity> {
    array_kind(value).ok().flatten()?;
    let torch = || -> PyResult<Identity> {
        Ok((
            value.call_method0("data_ptr")?.extract()?,
            value.call_method0("size")?.extract()?,
            value.call_method0("stride")?.extract()?,
            format!(
                "{} {}",
                value.getattr("dtype")?.str()?,
                value.getattr("device")?.str()?
            ),
        ))
    };
    let numpy = || -> PyResult<Identity> {
        let info = value.getattr("__array_interface__")?;
        let strides: Option<Vec<isize>> = info.get_item("strides")?.extract()?;
        Ok((
            info.get_item("data")?.get_item(0)?.extract()?,
            info.get_item("shape")?.extract()?,
            strides.unwrap_or_default(),
            info.get_item("typestr")?.extract()?,
        ))
    };
    torch().or_else(|_| numpy()).ok()
}

/// Which library's array a value is, by its type (`None`: neither).
#[derive(Debug, Clone, Copy)]
enum ArrayKind {
    Torch,
    Numpy,
}

/// The value's [`ArrayKind`], checked with `isinstance` against `torch.Tensor` and
/// `numpy.ndarray` (each only if its module is loaded: a tensor of a library that was
/// never imported cannot exist). An object that merely has a `data_ptr` method or an
/// `__array_interface__` is not one: its addresses would be read as memory.
fn array_kind(value: &Bound<'_, PyAny>) -> PyResult<Option<ArrayKind>> {
    let modules = value.py().import("sys")?.getattr("modules")?;
    for (module, class, kind) in [
        ("torch", "Tensor", ArrayKind::Torch),
        ("numpy", "ndarray", ArrayKind::Numpy),
    ] {
        let loaded = modules.call_method1("get", (module,))?;
        if !loaded.is_none() && value.is_instance(&loaded.getattr(class)?)? {
            return Ok(Some(kind));
        }
    }
    Ok(None)
}

/// A torch tensor's or a numpy array's memory; anything else is a `TypeError`
/// naming the key.
fn raw<'py>(name: &str, value: &Bound<'py, PyAny>) -> PyResult<Raw<'py>> {
    match array_kind(value)? {
        Some(ArrayKind::Torch) => torch_raw(name, value),
        Some(ArrayKind::Numpy) => numpy_raw(name, value),
        None => Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "{name}: expected a torch.Tensor or a numpy.ndarray, got {}",
            type_name(value)
        ))),
    }
}

fn torch_raw<'py>(name: &str, value: &Bound<'py, PyAny>) -> PyResult<Raw<'py>> {
    let mut t = value.call_method0("detach")?;
    let device: String = t.getattr("device")?.getattr("type")?.extract()?;
    if device != "cpu" {
        t = t.call_method0("cpu")?;
    }
    let t = t.call_method0("contiguous")?;
    let dtype_name = t.getattr("dtype")?.str()?.to_string();
    let dtype = match dtype_name.as_str() {
        "torch.float32" => DType::F32,
        "torch.bfloat16" => DType::BF16,
        "torch.float16" => DType::F16,
        "torch.float64" => DType::F64,
        other => {
            return Err(value_error(format!(
                "{name}: dtype {other} is not a float dtype (float32, bfloat16, float16 or \
                 float64)"
            )))
        }
    };
    let element: usize = t.call_method0("element_size")?.extract()?;
    if element != dtype.size_in_bytes() {
        return Err(value_error(format!(
            "{name}: {dtype_name} reports {element}-byte elements"
        )));
    }
    let dims: Vec<usize> = t.call_method0("size")?.extract()?;
    let address: usize = t.call_method0("data_ptr")?.extract()?;
    Ok(Raw {
        _owner: t,
        address,
        dims,
        dtype,
    })
}

fn numpy_raw<'py>(name: &str, value: &Bound<'py, PyAny>) -> PyResult<Raw<'py>> {
    let interface = |a: &Bound<'py, PyAny>| -> PyResult<Bound<'py, PyDict>> {
        a.getattr("__array_interface__")?
            .cast_into::<PyDict>()
            .map_err(|_| value_error(format!("{name}: __array_interface__ is not a dict")))
    };
    let mut array = value.clone();
    let mut info = interface(&array)?;
    let strided = info.get_item("strides")?.is_some_and(|s| !s.is_none());
    if strided {
        // numpy's own copy in C order (its `copy()` default).
        array = array.call_method0("copy")?;
        info = interface(&array)?;
    }
    let typestr: String = info
        .get_item("typestr")?
        .ok_or_else(|| value_error(format!("{name}: __array_interface__ has no typestr")))?
        .extract()?;
    // ml_dtypes' bfloat16 publishes itself as two opaque bytes.
    let dtype_name: String = array.getattr("dtype")?.getattr("name")?.extract()?;
    let dtype = match (typestr.as_str(), dtype_name.as_str()) {
        ("<f4", _) => DType::F32,
        ("<f2", _) => DType::F16,
        ("<f8", _) => DType::F64,
        (_, "bfloat16") => DType::BF16,
        (t, n) => {
            return Err(value_error(format!(
                "{name}: dtype {n} ({t}) is not a little-endian float dtype (float32, \
                 float16, float64, or ml_dtypes' bfloat16)"
            )))
        }
    };
    let dims: Vec<usize> = info
        .get_item("shape")?
        .ok_or_else(|| value_error(format!("{name}: __array_interface__ has no shape")))?
        .extract()?;
    let data = info
        .get_item("data")?
        .ok_or_else(|| value_error(format!("{name}: __array_interface__ has no data")))?;
    let data = data
        .cast_into::<PyTuple>()
        .map_err(|_| value_error(format!("{name}: the array's data is not in memory")))?;
    let address: usize = data.get_item(0)?.extract()?;
    Ok(Raw {
        _owner: array,
        address,
        dims,
        dtype,
    })
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}
