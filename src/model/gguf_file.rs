//! A bounds-checked GGUF reader.
//!
//! candle's own reader trusts every length field in the file: a corrupt or truncated
//! file can ask it for a multi-terabyte allocation, which aborts the process. This
//! reader checks every string, array and tensor against the bytes the file really has,
//! then hands candle a [`Content`] it can read tensors from safely.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, TensorInfo, Value, VersionedMagic};
use candle_core::quantized::GgmlDType;

use super::error::ModelError;

const GGUF_MAGIC: u32 = 0x4655_4747; // "GGUF" little-endian
const DEFAULT_ALIGNMENT: u64 = 32;
/// Nesting guard: GGUF arrays of arrays are legal but never deep in real files.
const MAX_ARRAY_DEPTH: usize = 4;
const MAX_DIMS: u32 = 8;
/// Most elements reserved up front for a count read from the file. Counts are checked
/// only against the bytes left, and an element's in-memory form is many times its
/// smallest encoding (a 1-byte array element becomes a 32-byte `Value`), so a corrupt
/// count in a large file can still ask for more memory than exists, and a failed
/// allocation aborts the process. Vectors grow past this as elements really parse.
const MAX_PREALLOC: u64 = 1 << 16;
/// Longest string accepted. The largest real ones are whole `tokenizer.json` files
/// (tens of MiB); a longer length is corrupt, and allocating it could abort the process
/// when the file is larger than memory (the length passes the file-size check).
const MAX_STRING: u64 = 256 << 20;

/// Parses the header of the GGUF file at `path`, validating it against the file size.
pub fn read_content(path: &Path) -> Result<(std::fs::File, Content), ModelError> {
    let mut file = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    let file_len = file.metadata().map_err(|e| ModelError::io(path, e))?.len();
    let content = {
        let mut reader = Reader {
            inner: std::io::BufReader::new(&mut file),
            pos: 0,
            len: file_len,
            path: path.to_path_buf(),
        };
        reader.content()?
    };
    Ok((file, content))
}

/// [`read_content`] of a file already in memory: the same checks, the length of
/// `bytes` as the file size, `path` only naming it in errors (the fuzz target).
pub fn read_content_from_bytes(bytes: &[u8], path: &Path) -> Result<Content, ModelError> {
    Reader {
        inner: bytes,
        pos: 0,
        len: bytes.len() as u64,
        path: path.to_path_buf(),
    }
    .content()
}

/// Maps GGUF's numeric type tags to candle's quantisation types.
pub fn ggml_dtype(tag: u32) -> Option<GgmlDType> {
    Some(match tag {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        9 => GgmlDType::Q8_1,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        15 => GgmlDType::Q8K,
        30 => GgmlDType::BF16,
        _ => return None,
    })
}

struct Reader<R> {
    inner: R,
    pos: u64,
    len: u64,
    path: PathBuf,
}

impl<R: Read> Reader<R> {
    fn corrupt(&self, msg: impl Into<String>) -> ModelError {
        ModelError::CorruptGguf {
            path: self.path.clone(),
            msg: msg.into(),
        }
    }

    /// Fails unless `n` more bytes exist, before anything is allocated for them.
    fn need(&self, n: u64, what: &str) -> Result<(), ModelError> {
        if self.len.saturating_sub(self.pos) < n {
            return Err(self.corrupt(format!(
                "truncated: {what} needs {n} bytes at offset {} but the file has {} bytes",
                self.pos, self.len
            )));
        }
        Ok(())
    }

    fn bytes(&mut self, n: u64, what: &str) -> Result<Vec<u8>, ModelError> {
        self.need(n, what)?;
        let mut buf = vec![0u8; n as usize];
        self.inner
            .read_exact(&mut buf)
            .map_err(|e| ModelError::io(&self.path, e))?;
        self.pos += n;
        Ok(buf)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ModelError> {
        let v = self.bytes(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&v);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, ModelError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, ModelError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn count(&mut self, v1: bool, what: &str) -> Result<u64, ModelError> {
        if v1 {
            Ok(self.u32(what)? as u64)
        } else {
            self.u64(what)
        }
    }

    fn string(&mut self, v1: bool, what: &str) -> Result<String, ModelError> {
        let n = self.count(v1, what)?;
        self.need(n, what)?;
        if n > MAX_STRING {
            return Err(self.corrupt(format!(
                "{what}: a string of {n} bytes at offset {} (longer than {MAX_STRING}; corrupt length?)",
                self.pos
            )));
        }
        let mut v = self.bytes(n, what)?;
        // Some writers null-terminate strings although the format says not to.
        while v.last() == Some(&0) {
            v.pop();
        }
        Ok(String::from_utf8_lossy(&v).into_owned())
    }

    fn value(&mut self, tag: u32, v1: bool, depth: usize, key: &str) -> Result<Value, ModelError> {
        Ok(match tag {
            0 => Value::U8(self.array::<1>(key)?[0]),
            1 => Value::I8(self.array::<1>(key)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(key)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(key)?)),
            4 => Value::U32(u32::from_le_bytes(self.array(key)?)),
            5 => Value::I32(i32::from_le_bytes(self.array(key)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(key)?)),
            7 => Value::Bool(self.array::<1>(key)?[0] != 0),
            8 => Value::String(self.string(v1, key)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.corrupt(format!("metadata '{key}': arrays nested too deep")));
                }
                let elem = self.u32(key)?;
                let n = self.count(v1, key)?;
                // Every element takes at least one byte, so a count beyond the remaining
                // bytes is corrupt; the reservation is capped as well (see MAX_PREALLOC).
                self.need(n, key)?;
                let mut out = Vec::with_capacity(n.min(MAX_PREALLOC) as usize);
                for _ in 0..n {
                    out.push(self.value(elem, v1, depth + 1, key)?);
                }
                Value::Array(out)
            }
            10 => Value::U64(self.u64(key)?),
            11 => Value::I64(i64::from_le_bytes(self.array(key)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(key)?)),
            other => {
                return Err(self.corrupt(format!("metadata '{key}': unknown value type {other}")))
            }
        })
    }

    fn content(&mut self) -> Result<Content, ModelError> {
        let magic = self.u32("magic")?;
        if magic != GGUF_MAGIC {
            return Err(self.corrupt(format!("bad magic 0x{magic:08x} (expected 'GGUF')")));
        }
        let version = self.u32("version")?;
        let magic = match version {
            1 => VersionedMagic::GgufV1,
            2 => VersionedMagic::GgufV2,
            3 => VersionedMagic::GgufV3,
            v => return Err(self.corrupt(format!("unsupported GGUF version {v}"))),
        };
        let v1 = version == 1;
        let tensor_count = self.count(v1, "tensor count")?;
        let kv_count = self.count(v1, "metadata count")?;
        self.need(kv_count.saturating_add(tensor_count), "header")?;

        let mut metadata = HashMap::new();
        for _ in 0..kv_count {
            let key = self.string(v1, "metadata key")?;
            let tag = self.u32(&key)?;
            let value = self.value(tag, v1, 0, &key)?;
            metadata.insert(key, value);
        }

        let mut infos = Vec::with_capacity(tensor_count.min(MAX_PREALLOC) as usize);
        for _ in 0..tensor_count {
            let name = self.string(v1, "tensor name")?;
            let n_dims = self.u32(&name)?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(self.corrupt(format!("tensor '{name}': {n_dims} dimensions")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                let d = self.count(v1, &name)?;
                dims.push(usize::try_from(d).map_err(|_| self.corrupt("dimension overflow"))?);
            }
            // GGUF lists the fastest-varying dimension first; candle wants it last.
            dims.reverse();
            let tag = self.u32(&name)?;
            let dtype = ggml_dtype(tag)
                .ok_or_else(|| self.corrupt(format!("tensor '{name}': unknown type {tag}")))?;
            let offset = self.u64(&name)?;
            infos.push((name, dims, dtype, offset));
        }

        let alignment = match metadata.get("general.alignment") {
            Some(Value::U32(v)) if *v > 0 => *v as u64,
            Some(Value::U64(v)) if *v > 0 => *v,
            _ => DEFAULT_ALIGNMENT,
        };
        let data_offset = self.pos.div_ceil(alignment) * alignment;
        let mut tensor_infos = HashMap::new();
        for (name, dims, dtype, offset) in infos {
            let elems = dims
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or_else(|| self.corrupt(format!("tensor '{name}': size overflow")))?;
            if elems % dtype.block_size() != 0 {
                return Err(self.corrupt(format!(
                    "tensor '{name}': {elems} elements is not a multiple of the {dtype:?} block size"
                )));
            }
            // Checked: a crafted element count would otherwise wrap to a small size,
            // pass the file-size check, and make the read allocate the real one (found
            // by the `gguf_header` fuzz target; `tests/fuzz_regression_tests.rs`).
            let bytes = ((elems / dtype.block_size()) as u64)
                .checked_mul(dtype.type_size() as u64)
                .ok_or_else(|| self.corrupt(format!("tensor '{name}': size overflow")))?;
            let end = data_offset.saturating_add(offset).saturating_add(bytes);
            if end > self.len {
                return Err(self.corrupt(format!(
                    "truncated: tensor '{name}' ends at byte {end} but the file has {} bytes",
                    self.len
                )));
            }
            tensor_infos.insert(
                name,
                TensorInfo {
                    ggml_dtype: dtype,
                    shape: candle_core::Shape::from(dims),
                    offset,
                },
            );
        }
        Ok(Content {
            magic,
            metadata,
            tensor_infos,
            tensor_data_offset: data_offset,
        })
    }
}

/// Reads one tensor after [`read_content`] validated that its bytes exist.
pub fn read_tensor<R: Read + Seek>(
    reader: &mut R,
    content: &Content,
    name: &str,
    path: &Path,
) -> Result<candle_core::quantized::QTensor, ModelError> {
    if !content.tensor_infos.contains_key(name) {
        return Err(ModelError::MissingTensor {
            path: path.to_path_buf(),
            name: name.to_string(),
        });
    }
    reader
        .seek(SeekFrom::Start(content.tensor_data_offset))
        .map_err(|e| ModelError::io(path, e))?;
    content
        .tensor(reader, name, &candle_core::Device::Cpu)
        .map_err(|source| ModelError::GgufTensor {
            path: path.to_path_buf(),
            name: name.to_string(),
            source: Box::new(source),
        })
}

/// Typed metadata access with errors naming the file and key.
pub struct Metadata<'a> {
    /// The parsed header: metadata and tensor infos.
    pub content: &'a Content,
    /// The file it came from, named in every error.
    pub path: &'a Path,
}

impl Metadata<'_> {
    fn missing(&self, key: &str, why: &str) -> ModelError {
        ModelError::Config {
            path: self.path.to_path_buf(),
            msg: format!("metadata '{key}' {why}"),
        }
    }

    /// The raw value of `key`, `None` if absent.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    /// The string at `key`; an error if it is absent or not a string.
    pub fn string(&self, key: &str) -> Result<&str, ModelError> {
        match self.get(key) {
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(self.missing(key, "is not a string")),
            None => Err(self.missing(key, "is missing")),
        }
    }

    /// The non-negative integer at `key`, of any integer type; an error if it is absent,
    /// negative, not an integer or too large for `usize`.
    pub fn usize(&self, key: &str) -> Result<usize, ModelError> {
        let v = self
            .get(key)
            .ok_or_else(|| self.missing(key, "is missing"))?;
        let n = match v {
            Value::U8(x) => *x as u64,
            Value::U16(x) => *x as u64,
            Value::U32(x) => *x as u64,
            Value::U64(x) => *x,
            Value::I8(x) if *x >= 0 => *x as u64,
            Value::I16(x) if *x >= 0 => *x as u64,
            Value::I32(x) if *x >= 0 => *x as u64,
            Value::I64(x) if *x >= 0 => *x as u64,
            _ => return Err(self.missing(key, "is not a non-negative integer")),
        };
        usize::try_from(n).map_err(|_| self.missing(key, "is too large"))
    }

    /// As [`Self::usize`], but `None` when `key` is absent.
    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>, ModelError> {
        if self.get(key).is_none() {
            return Ok(None);
        }
        self.usize(key).map(Some)
    }

    /// The float (f32 or f64) at `key`; an error if it is absent or not a float.
    pub fn f64(&self, key: &str) -> Result<f64, ModelError> {
        match self.get(key) {
            Some(Value::F32(x)) => Ok(*x as f64),
            Some(Value::F64(x)) => Ok(*x),
            Some(_) => Err(self.missing(key, "is not a float")),
            None => Err(self.missing(key, "is missing")),
        }
    }

    /// The boolean at `key`; `None` if it is absent or not a boolean.
    pub fn bool(&self, key: &str) -> Option<bool> {
        match self.get(key) {
            Some(Value::Bool(b)) => Some(*b),
            _ => None,
        }
    }

    /// The array of strings at `key`; an error if it is absent, not an array, or holds
    /// anything else.
    pub fn strings(&self, key: &str) -> Result<Vec<String>, ModelError> {
        match self.get(key) {
            Some(Value::Array(vs)) => vs
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    _ => Err(self.missing(key, "holds a non-string")),
                })
                .collect(),
            Some(_) => Err(self.missing(key, "is not an array")),
            None => Err(self.missing(key, "is missing")),
        }
    }

    /// The array of integers (8, 32 or 64 bits) at `key`; an error if it is absent, not an
    /// array, or holds anything else.
    pub fn ints(&self, key: &str) -> Result<Vec<i64>, ModelError> {
        match self.get(key) {
            Some(Value::Array(vs)) => vs
                .iter()
                .map(|v| match v {
                    Value::I32(x) => Ok(*x as i64),
                    Value::U32(x) => Ok(*x as i64),
                    Value::I64(x) => Ok(*x),
                    Value::U8(x) => Ok(*x as i64),
                    Value::I8(x) => Ok(*x as i64),
                    _ => Err(self.missing(key, "holds a non-integer")),
                })
                .collect(),
            Some(_) => Err(self.missing(key, "is not an array")),
            None => Err(self.missing(key, "is missing")),
        }
    }
}
