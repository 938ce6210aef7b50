//! Finding the python a test drives: the one an environment variable names (else
//! `python3`), if it imports what the test needs. Missing, the test is skipped with
//! a line saying how to provide it, unless the `require` variable is set (as
//! `.ci/run` sets it), where a missing package fails instead.

use std::process::Command;

/// What a test needs of its python.
pub struct PythonNeeds<'a> {
    /// The variable naming the python (`TREEGRPO_PYTHON_PACKAGE`, …).
    pub python_var: &'a str,
    /// The variable that turns a skip into a failure (`TREEGRPO_REQUIRE_…`).
    pub require_var: &'a str,
    /// The modules it must import, comma-separated as in an `import` statement.
    pub modules: &'a str,
    /// How a user provides them, for the skip line.
    pub how: &'a str,
}

/// The python to run with, or `None` (skipped) when it cannot import the modules.
pub fn python_with(needs: PythonNeeds<'_>) -> Option<String> {
    let python = std::env::var(needs.python_var).unwrap_or_else(|_| "python3".into());
    let found = Command::new(&python)
        .args(["-c", &format!("import {}", needs.modules)])
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some(python);
    }
    assert!(
        std::env::var(needs.require_var).is_err(),
        "{python} cannot import {} ({} is set)",
        needs.modules,
        needs.require_var
    );
    eprintln!(
        "skipped: {python} cannot import {} ({})",
        needs.modules, needs.how
    );
    None
}
