"""Tree rollouts over environments written in Python (and a built-in task): tree
shape, loss masks against the forest's own record, determinism, concurrency of tools,
and environments that fail or hang."""

import asyncio
import threading
import time

import pytest

import treegrpo

SYSTEM = (
    "You solve arithmetic. To compute, write <calc>expression</calc> and stop; the "
    "result comes back. Finish with <answer>number</answer>."
)


class CalcTask:
    """A small tool task: a calculator call returns a result, an answer ends the episode."""

    stop = ["</calc>", "</answer>"]

    def reset(self, sample):
        self.target = sample["target"]
        self.calls = 0
        return [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": sample["question"]},
        ]

    def step(self, action):
        if "<answer>" in action:
            answer = action.split("<answer>")[-1].split("</answer>")[0].strip()
            return None, True, 1.0 if answer == str(self.target) else 0.0
        self.calls += 1
        if "<calc>" in action:
            expr = action.split("<calc>")[-1].split("</calc>")[0]
            try:
                value = eval(expr, {"__builtins__": {}}, {})  # test fixture only
            except Exception:
                value = "error"
            return f"\n<result>{value}</result>\n", False, 0.0
        return "\nWrite <calc>...</calc> or <answer>...</answer>.\n", False, 0.0


SAMPLES = [
    {"id": "q0", "question": "What is 17 * 3?", "target": 51},
    {"id": "q1", "question": "What is 120 / 4?", "target": 30},
]

SHAPE = dict(trees=2, expand=2, rounds=1, max_turns=2, max_step_tokens=24, seed=7)


def leaves_of(tree):
    parents = {n["parent"] for n in tree["nodes"] if n["parent"] is not None}
    return [n for n in tree["nodes"] if n["id"] not in parents and n["parent"] is not None]


def test_a_python_environment_grows_2_2_1_trees(engine):
    result = treegrpo.rollout(engine, CalcTask, SAMPLES, **SHAPE)
    assert result.summary["failed_branches"] == 0
    assert len(result.forests) == 2 * len(SAMPLES)
    for tree in result.forests:
        assert len(leaves_of(tree)) == 1 + 2 * 1  # 1 + N*L leaves per tree
    assert len(result.trajectories) == len(SAMPLES) * 2 * 3
    nodes = {(t["prompt_uid"], t["tree_id"]): {n["id"]: n for n in t["nodes"]} for t in result.forests}
    for traj in result.trajectories:
        assert isinstance(traj["advantage"], float)
        path = nodes[(traj["prompt_uid"], traj["tree_id"])]
        ids, mask = [], []
        for node_id in traj["node_path"][1:]:
            node = path[node_id]
            ids += node["tokens"] + node["obs_tokens"]
            mask += [1] * len(node["tokens"]) + [0] * len(node["obs_tokens"])
            if node["obs_tokens"]:
                # The 0-masked tokens are exactly the environment's observation.
                assert engine.tokenizer.decode(node["obs_tokens"]) == node["observation"]
        assert traj["response_ids"] == ids
        assert traj["response_mask"] == mask
        assert len(traj["response_logprobs"]) == len(ids)
        assert all(lp == 0.0 for lp, m in zip(traj["response_logprobs"], mask) if m == 0)
    uids = {t["prompt_uid"] for t in result.trajectories}
    assert uids == {"q0", "q1"}


def test_the_same_seed_gives_the_same_trajectories(engine):
    a = treegrpo.rollout(engine, CalcTask, SAMPLES[:1], **SHAPE)
    b = treegrpo.rollout(engine, CalcTask, SAMPLES[:1], **SHAPE)
    assert a.trajectories == b.trajectories
    c = treegrpo.rollout(engine, CalcTask, SAMPLES[:1], **{**SHAPE, "seed": 8})
    assert [t["response_ids"] for t in c.trajectories] != [t["response_ids"] for t in a.trajectories]


class SlowAsyncTask(CalcTask):
    """`async def step` that waits on a 'tool': records how many run at once."""

    lock = threading.Lock()
    running = 0
    most = 0

    def enter(self):
        cls = SlowAsyncTask
        with cls.lock:
            cls.running += 1
            cls.most = max(cls.most, cls.running)

    def leave(self):
        with SlowAsyncTask.lock:
            SlowAsyncTask.running -= 1
        if self.calls >= 1:
            return None, True, 0.5
        self.calls += 1
        return "\n<result>ok</result>\n", False, 0.0

    async def step(self, action):
        self.enter()
        await asyncio.sleep(0.2)
        return self.leave()


class SlowSyncTask(SlowAsyncTask):
    def step(self, action):
        self.enter()
        time.sleep(0.2)  # releases the GIL, as I/O does
        return self.leave()


@pytest.mark.parametrize("task", [SlowAsyncTask, SlowSyncTask])
def test_python_tools_run_concurrently(engine, task):
    SlowAsyncTask.most = 0
    result = treegrpo.rollout(engine, task, SAMPLES, trees=2, expand=1, rounds=1, max_turns=2, max_step_tokens=8)
    assert result.summary["failed_branches"] == 0
    assert all(t["reward"] == 0.5 for t in result.trajectories)
    assert SlowAsyncTask.most > 1  # several branches' tools were waiting at once


class RaisingTask(CalcTask):
    def step(self, action):
        if self.calls >= 1:
            raise RuntimeError("tool backend is down")
        self.calls += 1
        return "\n<result>1</result>\n", False, 0.0


class HangingTask(CalcTask):
    def step(self, action):
        time.sleep(5)
        return None, True, 1.0


class BadReturnTask(CalcTask):
    def step(self, action):
        return "just a string"


@pytest.mark.parametrize(
    "task, message",
    [
        (RaisingTask, "tool backend is down"),
        (HangingTask, "timeout"),
        (BadReturnTask, "must return (observation"),
    ],
)
def test_a_failing_environment_ends_its_branch_not_the_run(engine, task, message):
    result = treegrpo.rollout(
        engine, task, SAMPLES[:1], chains=2, max_turns=2, max_step_tokens=8, env_timeout=0.5
    )
    failed = [f for forest in result.summary["forests"] for f in forest["failed_branches"]]
    assert len(failed) == 2
    assert all(message in f["error"] for f in failed)
    assert result.summary["failed_branches"] == 2
    [g] = engine.generate(["Still serving?"], max_tokens=2)
    assert len(g.token_ids) >= 1


class FailingResetTask(CalcTask):
    def reset(self, sample):
        if sample["id"] == "q1":
            raise KeyError("no such question")
        return super().reset(sample)


def test_a_failing_reset_fails_only_its_prompt(engine):
    result = treegrpo.rollout(engine, FailingResetTask, SAMPLES, chains=2, max_turns=1, max_step_tokens=8)
    assert {t["prompt_uid"] for t in result.trajectories} == {"q0"}
    failed = [f for forest in result.summary["forests"] for f in forest["failed_branches"]]
    assert any("no such question" in f["error"] and f["tree"] is None for f in failed)


def test_a_built_in_task(engine):
    result = treegrpo.rollout(engine, "calc", 1, trees=2, expand=2, rounds=1, max_step_tokens=24, temperature=1.0)
    assert len(result.trajectories) == 6
    assert all(t["prompt_uid"] == result.trajectories[0]["prompt_uid"] for t in result.trajectories)
    assert result.summary["tokens"]["reused"] > 0  # branches forked the prompt's KV


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(env="no-such-task", samples=1), ValueError),
        (dict(env=CalcTask, samples=3), ValueError),
        (dict(env=CalcTask, samples=SAMPLES, trees=0), ValueError),
        (dict(env=CalcTask, samples=SAMPLES, keep=0), ValueError),
        (dict(env=CalcTask, samples=SAMPLES, temperature=-1.0), ValueError),
        (dict(env=CalcTask, samples=SAMPLES, temperature=1e-50), ValueError),
        (dict(env=CalcTask, samples=SAMPLES, select="best"), ValueError),
        (dict(env=CalcTask, samples=SAMPLES, advantage="magic"), ValueError),
        (dict(env=CalcTask, samples=[]), ValueError),
        (dict(env="calc", samples=[{"question": "no id"}]), ValueError),
    ],
)
def test_bad_rollout_arguments(engine, kwargs, error):
    with pytest.raises(error):
        treegrpo.rollout(engine, **kwargs)


def test_ctrl_c_stops_a_rollout_and_frees_its_sequences(engine, sigint_raises):
    import _thread

    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        # Long enough that the interrupt lands mid-run.
        treegrpo.rollout(engine, "calc", 8, trees=2, expand=2, rounds=1, max_step_tokens=256)
    timer.cancel()
    # Every branch, snapshot and root the abandoned forests held was freed.
    assert engine.stats()["sequences"] == 0
    result = treegrpo.rollout(engine, CalcTask, SAMPLES[:1], chains=2, max_turns=1, max_step_tokens=8)
    assert len(result.trajectories) == 2


def test_rollout_options_are_refused_in_the_librarys_words(engine):
    """The CLI and the server say the same (tests/cli_tests.rs, serve_sampling_tests.rs)."""
    with pytest.raises(ValueError, match=r"keep must be at least 1 \(or absent: every leaf\)"):
        treegrpo.rollout(engine, CalcTask, SAMPLES, keep=0)
    with pytest.raises(ValueError, match=r"temperature -1 is not a temperature"):
        treegrpo.rollout(engine, CalcTask, SAMPLES, temperature=-1.0)
