"""One update from Python, served by the engine: the new weights' version and
changed outputs, and the update's bad inputs."""

import pytest

import treegrpo

from test_rollout import SAMPLES, CalcTask


def test_update_then_serve_the_new_weights(tmp_path):
    engine = treegrpo.Engine(kv_mib=256, seed=0)
    result = treegrpo.rollout(engine, CalcTask, SAMPLES[:1], chains=2, max_turns=1, max_step_tokens=12)
    # Rewards of an untrained model may all be 0: give the leaves distinct advantages
    # so the update has a gradient to follow.
    trajectories = [dict(t, advantage=(1.0 if i == 0 else -1.0)) for i, t in enumerate(result.trajectories)]
    metrics = treegrpo.update(None, trajectories, str(tmp_path / "ckpt"), lr=1e-4)
    assert metrics["step"] == 1
    assert metrics["grad_norm"] > 0
    for key in ("loss", "pg_loss", "kl", "entropy", "clip_fraction", "update_seconds"):
        assert key in metrics
    assert (tmp_path / "ckpt" / "config.json").exists()
    ids = engine.tokenizer.encode("The capital of France is")
    [before] = engine.generate([ids], max_tokens=8)
    version = engine.load_weights(str(tmp_path / "ckpt"))
    assert version == engine.weight_version == 1
    [after] = engine.generate([ids], max_tokens=8)
    assert after.weight_version == 1 and before.weight_version == 0
    assert after.logprobs != before.logprobs


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(lr=-1.0), "non-negative"),
        (dict(optimizer="lion"), "optimizer"),
        (dict(loss_agg="mean"), "loss_agg"),
        (dict(learning_rate=1e-5), "unknown update option"),
    ],
)
def test_bad_update_options(tmp_path, options, match):
    with pytest.raises(ValueError, match=match):
        treegrpo.update(None, [], str(tmp_path / "x"), **options)


def test_bad_trajectories(tmp_path):
    with pytest.raises(ValueError):
        treegrpo.update(None, [{"prompt_ids": [1]}], str(tmp_path / "x"))
