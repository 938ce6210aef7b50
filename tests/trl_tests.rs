//! TRL's `GRPOTrainer` training through the engine (`python/tests/test_trl.py`), and
//! the torch checks of `Engine.load_state_dict` (`python/tests/test_state_dict.py`:
//! bf16 tensors, a head that shares the embedding's memory), run in the venv that has
//! torch, transformers 5, trl, accelerate and datasets. `TREEGRPO_TRL_PYTHON` names
//! its python: `.ci/run` makes that venv (kept between runs, pinned), installs this
//! checkout's wheel in it and sets `TREEGRPO_REQUIRE_TRL=1`, so in CI a missing
//! package fails instead of skipping. A separate test binary from the package's main
//! suite (`python_package_tests.rs`), so the two pytest runs do not share the cores.

mod common;

use std::process::Command;

/// The python to run the TRL tests with, if one has the package, pytest, torch and
/// trl.
fn trl_python() -> Option<String> {
    common::python::python_with(common::python::PythonNeeds {
        python_var: "TREEGRPO_TRL_PYTHON",
        require_var: "TREEGRPO_REQUIRE_TRL",
        modules: "treegrpo, pytest, torch, transformers, trl, datasets",
        how: "make a venv with them and the package, then set TREEGRPO_TRL_PYTHON",
    })
}

#[test]
fn trl_grpo_trainer_trains_through_the_engine() {
    let Some(python) = trl_python() else {
        return;
    };
    // The suite's conftest starts an engine on the default model for every test.
    common::default_model();
    // test_state_dict.py reads and rewrites this tiny HF model's weights.
    let tiny = tempfile::tempdir().unwrap();
    common::tiny::write_long_context(tiny.path(), 5);
    let out = Command::new(&python)
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--durations=5",
            "python/tests/test_state_dict.py",
            "python/tests/test_trl.py",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("TREEGRPO_TEST_MODEL", tiny.path())
        .env("TRL_EXPERIMENTAL_SILENCE", "1")
        .output()
        .expect("cannot run pytest");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}\n{stderr}");
    assert!(
        out.status.success(),
        "the TRL tests failed:\n{stdout}\n{stderr}"
    );
}
