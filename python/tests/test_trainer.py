"""The training loop from Python: steps that update and swap weights into the
engine, the log's fields, and a resumed run that goes on from its checkpoint."""

import json

import pytest

import treegrpo

from conftest import TEST_MODEL
from test_rollout import SAMPLES, CalcTask

LOOP = dict(
    train=SAMPLES,
    test=SAMPLES[:1],
    prompts_per_step=1,
    chains=2,
    max_turns=1,
    max_step_tokens=12,
    eval_every=1,
    lr=1e-4,
)

LOG_FIELDS = {
    "step",
    "weight_version",
    "reward_mean",
    "eval_reward",
    "rollouts",
    "tokens",
    "loss",
    "pg_loss",
    "kl",
    "entropy",
    "grad_norm",
    "clip_fraction",
    "tis_mean",
    "rollout_seconds",
    "update_seconds",
}


def test_trainer_steps_update_and_serve_each_policy_then_resume(tmp_path):
    engine = treegrpo.Engine(kv_mib=256, model=TEST_MODEL)
    # A frozen KL reference (the starting weights), so the logged KL moves off 0.
    loop = {**LOOP, "kl_reference": "start"}
    with treegrpo.Trainer(engine, CalcTask, tmp_path / "run", steps=2, **loop) as trainer:
        lines = trainer.run()
        assert trainer.step == 2
    steps = [l for l in lines if l["step"] > 0]
    assert [l["step"] for l in steps] == [1, 2]
    for l in steps:
        assert LOG_FIELDS <= set(l), LOG_FIELDS - set(l)
        assert l["rollouts"] == 2
    assert [l["weight_version"] for l in steps] == [0, 1]  # the policy that sampled it
    assert engine.weight_version == 2  # the policy after step 2 is served
    logged = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [l["step"] for l in logged] == [l["step"] for l in lines]
    assert (tmp_path / "run" / "checkpoint" / "config.json").exists()
    # Step 1 scores the starting policy against itself; step 2's policy has moved.
    assert abs(steps[0]["kl"]) < 1e-9
    assert steps[1]["kl"] > 0
    assert (tmp_path / "run" / "reference" / "model.safetensors").exists()
    # The run's record, the fields `treegrpo train` writes.
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["kl_reference"] == "start"
    assert record["task"] is None and record["warm_start"] == 0

    # A new trainer on a fresh engine continues from the checkpoint of step 2; it
    # names no KL reference: a resumed run keeps the one run.json records.
    fresh = treegrpo.Engine(kv_mib=256, model=TEST_MODEL)
    with treegrpo.Trainer(fresh, CalcTask, tmp_path / "run", steps=3, **LOOP) as resumed:
        assert resumed.resume() == 2
        more = resumed.run()
    assert more[-1]["step"] == 3
    assert more[-1]["kl"] > 0  # against the reference read back from the run folder
    assert fresh.weight_version >= 1

    # A fresh trainer on the same folder keeps its history: run() is refused, the log
    # is untouched (resume() or overwrite=True are the ways on).
    log = (tmp_path / "run" / "log.jsonl").read_bytes()
    with treegrpo.Trainer(fresh, CalcTask, tmp_path / "run", steps=3, **LOOP) as again:
        with pytest.raises(FileExistsError, match="already holds a training run"):
            again.run()
    assert (tmp_path / "run" / "log.jsonl").read_bytes() == log


def test_trainer_bad_options(tmp_path):
    engine = treegrpo.Engine(kv_mib=64)
    import pytest

    with pytest.raises(ValueError, match="prompts_per_step"):
        treegrpo.Trainer(engine, CalcTask, tmp_path / "a", **{**LOOP, "prompts_per_step": 0})
    with pytest.raises(ValueError, match="serve_format"):
        treegrpo.Trainer(engine, CalcTask, tmp_path / "b", serve_format="q4", **LOOP)
    with pytest.raises(ValueError, match="kl_reference"):
        treegrpo.Trainer(engine, CalcTask, tmp_path / "d", kl_reference="initial", **LOOP)
    with pytest.raises(ValueError, match="eval_every needs test samples"):
        treegrpo.Trainer(engine, CalcTask, tmp_path / "c", **{**LOOP, "test": []})


def test_a_trainer_without_keywords_has_the_clis_defaults(tmp_path, treegrpo_bin):
    """Every run setting Python leaves at its default equals `treegrpo train` without
    flags, which equals the library's `LoopConfig::default()` (tests/cli_tests.rs)."""
    import subprocess

    engine = treegrpo.Engine(kv_mib=64, model=TEST_MODEL)
    with treegrpo.Trainer(engine, CalcTask, tmp_path / "run", train=SAMPLES, test=SAMPLES) as t:
        ours = t.config
    cli = subprocess.run(
        [treegrpo_bin, "train", "--print-config"], check=True, capture_output=True, text=True
    )
    assert ours == json.loads(cli.stdout)
