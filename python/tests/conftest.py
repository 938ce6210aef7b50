"""Shared fixtures: one engine on the default model for the whole suite (loading it
takes seconds), and the `treegrpo` binary the suite compares against.

`TEST_MODEL`: the model of the tests whose checks do not depend on the model (the
trainer's and the Ray pool's bookkeeping): the tiny model `cargo test` writes and
names in `TREEGRPO_TEST_MODEL`, else (None) the default model.

Run by `cargo test` (tests/python_package_tests.rs) in a venv where the package is
installed, or by hand: `pytest python/tests` with `TREEGRPO_BIN` naming the binary.
"""

import os
import shutil
import signal

import pytest

import treegrpo

TEST_MODEL = os.environ.get("TREEGRPO_TEST_MODEL")


@pytest.fixture(scope="session")
def engine():
    return treegrpo.Engine(kv_mib=512, seed=0)


@pytest.fixture(scope="session")
def treegrpo_bin():
    path = os.environ.get("TREEGRPO_BIN") or shutil.which("treegrpo")
    if not path:
        pytest.skip("no treegrpo binary (set TREEGRPO_BIN)")
    return path


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt during the test even where the suite started
    with SIGINT ignored (a shell's background job, some CI runners): Python then
    installs no handler, and `_thread.interrupt_main` does nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(autouse=True)
def no_sequence_left(engine):
    """Every test leaves the engine as it found it: no live sequence."""
    yield
    assert engine.stats()["sequences"] == 0, "a test left sequences in the engine"
