"""treegrpo.ray on a local Ray instance this module starts (loopback only): a pool of
two replicas gives the trajectories of one engine in-process, each prompt's forest
from one replica; a replica killed mid-run has its prompts re-run elsewhere and is
replaced; new weights reach every replica; a Python environment travels to the
actors; bad input is refused."""

import os

import pytest

import treegrpo

try:
    import ray
    from ray import cloudpickle
except ImportError:
    if os.environ.get("TREEGRPO_REQUIRE_PYTHON_PACKAGE"):
        raise
    pytest.skip("ray is not installed (pip install 'treegrpo[ray]')", allow_module_level=True)

from treegrpo.ray import PoolError, RolloutPool

import test_rollout
from conftest import TEST_MODEL
from test_rollout import SAMPLES, CalcTask

# The environment class travels to the actors by value: its module (this suite's)
# is not importable in Ray's worker processes.
cloudpickle.register_pickle_by_value(test_rollout)

SHAPE = dict(trees=2, expand=2, rounds=1, max_turns=1, max_step_tokens=16, seed=3)
PROMPTS = 8
ENGINE = dict(kv_mib=256, seed=0, model=TEST_MODEL)


@pytest.fixture(scope="module")
def local_ray():
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # Four logical CPUs on this 2-core machine: the module's pool (2 replicas of one
    # CPU each) and a second pool of a test's own fit at once.
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        object_store_memory=256 * 1024 * 1024,
        log_to_driver=False,
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def pool(local_ray):
    with RolloutPool(2, threads=1, **ENGINE) as p:
        yield p


@pytest.fixture(scope="module")
def one_engine_result():
    """The reference: the same rollout on one engine in this process."""
    engine = treegrpo.Engine(**ENGINE)
    return treegrpo.rollout(engine, "calc", PROMPTS, **SHAPE)


def decoded_per_replica(pool):
    return [s["counters"]["decoded"] for s in ray.get([a.stats.remote() for a in pool.replicas])]


def test_two_replicas_give_the_trajectories_of_one_engine(pool, one_engine_result):
    before = decoded_per_replica(pool)
    spread = pool.rollout("calc", PROMPTS, **SHAPE)
    after = decoded_per_replica(pool)
    single = one_engine_result
    # M trees of one chain each plus N branches per round: M * (1 + N * L) leaves.
    assert len(single.trajectories) == PROMPTS * 2 * (1 + 2 * 1)
    assert spread.trajectories == single.trajectories
    assert spread.forests == single.forests
    forests = spread.summary["forests"]
    assert [f["prompt_index"] for f in forests] == list(range(PROMPTS))
    assert [f["prompt_uid"] for f in forests] == [f["prompt_uid"] for f in single.summary["forests"]]
    assert {f["replica"] for f in forests} == {0, 1}, "both replicas got prompts"
    assert all(f["attempts"] == 1 and f["weight_version"] == 0 for f in forests)
    # Each prompt's forest was grown on the replica it names: every replica's engine
    # decoded exactly the tokens of the forests attributed to it.
    for replica in (0, 1):
        mine = sum(f["tokens"]["decoded"] for f in forests if f["replica"] == replica)
        assert after[replica] - before[replica] == mine
    s, r = spread.summary, single.summary
    assert s["rollouts"] == r["rollouts"]
    assert s["tokens"]["decoded"] == r["tokens"]["decoded"]
    assert s["mean_reward"] == pytest.approx(r["mean_reward"])
    assert s["pool"] == {"replicas": 2, "live_replicas": 2, "replica_deaths": 0, "reruns": 0}


def test_a_killed_replica_has_its_prompts_rerun_and_is_replaced(local_ray, one_engine_result):
    with RolloutPool(2, threads=1, **ENGINE) as pool:
        killed = []

        def kill_the_busier_replica(progress):
            if not killed:
                victim = max(range(2), key=lambda i: pool.outstanding[i])
                assert pool.outstanding[victim] > 0
                killed.append(victim)
                ray.kill(pool.slots[victim].actor)

        out = pool.rollout(
            "calc", PROMPTS, progress=kill_the_busier_replica, max_concurrent_prompts=2, **SHAPE
        )
        assert killed
        forests = out.summary["forests"]
        assert [f["prompt_index"] for f in forests] == list(range(PROMPTS)), "each prompt once"
        assert out.summary["pool"]["replica_deaths"] == 1
        assert out.summary["pool"]["reruns"] >= 1
        assert any(f["attempts"] == 2 for f in forests)
        # Seeds derive from the prompt: re-run prompts give the trees they gave anywhere.
        assert out.trajectories == one_engine_result.trajectories
        assert out.forests == one_engine_result.forests
        # The slot's replacement serves again.
        pool.wait_ready(120)
        assert len(pool.replicas) == 2
        [g] = pool.generate(["2 + 2 ="], max_tokens=2)
        assert len(g["token_ids"]) >= 1


def test_when_every_replica_died_the_finished_prompts_are_kept(local_ray, one_engine_result):
    with RolloutPool(1, threads=1, max_restarts=0, **ENGINE) as pool:
        actor = pool.slots[0].actor

        def kill_after_the_first_prompt(progress):
            ray.kill(actor)

        with pytest.raises(PoolError, match="every replica of the pool died") as e:
            pool.rollout(
                "calc", 4, progress=kill_after_the_first_prompt, max_concurrent_prompts=1, **SHAPE
            )
    partial = e.value.partial
    assert partial.summary["prompts"] == 4
    done = [f["prompt_index"] for f in partial.summary["forests"]]
    assert done and done == list(range(len(done))), "the prompts finished before the death"
    per_prompt = len(one_engine_result.trajectories) // PROMPTS
    assert partial.trajectories == one_engine_result.trajectories[: len(done) * per_prompt]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, one_engine_result):
    """A checkpoint that differs from the default model: one update on its rollouts."""
    trajectories = [
        dict(t, advantage=(1.0 if i % 2 == 0 else -1.0))
        for i, t in enumerate(one_engine_result.trajectories[:2])
    ]
    path = tmp_path_factory.mktemp("ray") / "ckpt"
    treegrpo.update(TEST_MODEL, trajectories, str(path), lr=1e-4)
    return str(path)


def test_new_weights_reach_every_replica(pool, checkpoint):
    prompt = "The capital of France is"
    before = [ray.get(a.generate.remote([prompt], max_tokens=8))[0] for a in pool.replicas]
    assert pool.load_weights(checkpoint) == 1
    assert [i["weight_version"] for i in pool.info()] == [1, 1]
    after = [ray.get(a.generate.remote([prompt], max_tokens=8))[0] for a in pool.replicas]
    for b, a in zip(before, after):
        assert (b["weight_version"], a["weight_version"]) == (0, 1)
        assert a["logprobs"] != b["logprobs"]
    out = pool.rollout("calc", 2, **SHAPE)
    assert out.summary["weight_version"] == 1
    assert all(f["weight_version"] == 1 for f in out.summary["forests"])


def test_a_state_dict_reaches_every_replica(pool):
    if TEST_MODEL is None:
        pytest.skip("needs the tiny HF model cargo test writes (TREEGRPO_TEST_MODEL)")
    from test_state_dict import moved, start_weights

    prompt = "The capital of France is"
    state = moved(start_weights(), seed=4)
    local = treegrpo.Engine(**ENGINE)
    local.load_state_dict(state)
    [want] = local.generate([prompt], max_tokens=8)
    version = pool.weight_version + 1
    assert pool.load_state_dict(state) == version
    assert [i["weight_version"] for i in pool.info()] == [version] * 2
    for a in pool.replicas:
        [got] = ray.get(a.generate.remote([prompt], max_tokens=8))
        assert (got["token_ids"], got["logprobs"]) == (want.token_ids, want.logprobs)
    bad = dict(state, **{"model.layers.0.mlp.extra.weight": state["model.norm.weight"]})
    with pytest.raises(ValueError, match="model.layers.0.mlp.extra.weight"):
        pool.load_state_dict(bad)
    assert pool.weight_version == version
    assert [i["weight_version"] for i in pool.info()] == [version] * 2


def test_a_python_environment_runs_on_the_replicas(pool):
    engine = treegrpo.Engine(**ENGINE)
    if isinstance(pool.weights, str):
        engine.load_weights(pool.weights, pool.weight_version)
    elif pool.weights is not None:  # a state dict's object ref
        engine.load_state_dict(ray.get(pool.weights), pool.weight_version)
    shape = dict(trees=2, expand=1, rounds=1, max_turns=1, max_step_tokens=12, seed=5)
    single = treegrpo.rollout(engine, CalcTask, SAMPLES, **shape)
    spread = pool.rollout(CalcTask, SAMPLES, **shape)
    assert spread.trajectories == single.trajectories
    assert [f["prompt_uid"] for f in spread.summary["forests"]] == ["q0", "q1"]


def test_a_token_budget_stops_new_prompts_and_keeps_the_started_ones(pool):
    # One prompt at a time per replica: two start, the budget is spent as the first
    # finishes, so the second finishes and no third starts.
    out = pool.rollout("calc", 4, token_budget=1, max_concurrent_prompts=1, **SHAPE)
    s = out.summary
    assert (s["prompts"], s["prompts_finished"]) == (4, 2)
    assert s["token_budget"] == 1 and s["budget_exhausted"]
    assert [f["prompt_index"] for f in s["forests"]] == [0, 1]
    assert len(out.trajectories) == 2 * 2 * (1 + 2 * 1)


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda p: p.rollout("calc", 2, learning_rate=1.0), TypeError),
        (lambda p: p.rollout("calc", []), ValueError),
        (lambda p: p.rollout(CalcTask, 2), TypeError),
        (lambda p: p.rollout("calc", 1, max_step_tokens=0), ValueError),
        (lambda p: p.rollout("no-such-task", 1), ValueError),
    ],
)
def test_bad_input_is_refused_and_the_pool_keeps_serving(pool, call, error):
    with pytest.raises(error):
        call(pool)
    assert len(pool.replicas) == 2
    [g] = pool.generate(["1 + 1 ="], max_tokens=1)
    assert len(g["token_ids"]) == 1


def test_a_replica_that_cannot_start_fails_the_pool_with_its_cause(local_ray, tmp_path):
    missing = tmp_path / "no-such-model.gguf"
    with pytest.raises(PoolError, match="no replica of the pool started"):
        RolloutPool(1, **{**ENGINE, "model": missing})
