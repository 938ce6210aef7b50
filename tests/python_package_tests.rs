//! The Python package's pytest suite (`python/tests`), run against the package as
//! installed: `TREEGRPO_PYTHON_PACKAGE` names a python whose `treegrpo` is the wheel
//! built from `python/` (`.ci/run` builds it, installs it in a fresh venv with
//! pytest and sets `TREEGRPO_REQUIRE_PYTHON_PACKAGE=1`, so in CI a missing package
//! fails instead of skipping). The suite compares the package against this build's
//! `treegrpo` binary (`TREEGRPO_BIN`).

mod common;

use std::process::Command;

/// The python to run the suite with, if one has the package and pytest.
fn python_with_package() -> Option<String> {
    common::python::python_with(common::python::PythonNeeds {
        python_var: "TREEGRPO_PYTHON_PACKAGE",
        require_var: "TREEGRPO_REQUIRE_PYTHON_PACKAGE",
        modules: "treegrpo, pytest",
        how: "pip install ./python pytest, then set TREEGRPO_PYTHON_PACKAGE",
    })
}

#[test]
fn the_python_package_passes_its_pytest_suite() {
    let Some(python) = python_with_package() else {
        return;
    };
    // Fetched here so the suite's engines find the model in the cache.
    common::default_model();
    // A tiny model (seeded random weights, HF layout) for the tests whose checks do
    // not depend on the model (the trainer's bookkeeping, the Ray pool's): minutes of
    // CI time on the default model.
    let tiny = tempfile::tempdir().unwrap();
    common::tiny::write_long_context(tiny.path(), 5);
    let out = Command::new(&python)
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            // The slowest tests' times in the log: what to trim when CI grows.
            "--durations=8",
            // Run by tests/trl_tests.rs, in the venv that has torch and trl.
            "--ignore=python/tests/test_trl.py",
            "python/tests",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("TREEGRPO_BIN", env!("CARGO_BIN_EXE_treegrpo"))
        .env("TREEGRPO_TEST_MODEL", tiny.path())
        .output()
        .expect("cannot run pytest");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}\n{stderr}");
    assert!(
        out.status.success(),
        "the Python package's tests failed:\n{stdout}\n{stderr}"
    );
}
