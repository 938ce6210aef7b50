"""The adapters' outputs against the field lists of verl's `AgentLoopOutput` and
TRL's `rollout_func` contract, written out here from those projects' sources."""

import pytest

import treegrpo
from treegrpo import adapters

from test_rollout import SAMPLES, CalcTask

# verl/experimental/agent_loop/agent_loop.py, class AgentLoopOutput(BaseModel).
VERL_AGENT_LOOP_OUTPUT_FIELDS = {
    "prompt_ids",
    "response_ids",
    "response_mask",
    "response_logprobs",
    "multi_modal_data",
    "reward_score",
    "num_turns",
    "metrics",
    "extra_fields",
}
# trl GRPOTrainer: rollout_func(prompts, trainer) returns these per completion;
# other keys are extra columns handed to the reward functions.
TRL_ROLLOUT_FUNC_FIELDS = {"prompt_ids", "completion_ids", "logprobs"}
TRL_OPTIONAL_FIELDS = {"env_mask"}


@pytest.fixture(scope="module")
def result(engine):
    return treegrpo.rollout(
        engine, CalcTask, SAMPLES, trees=2, expand=2, rounds=1, max_turns=1, max_step_tokens=16
    )


def test_to_verl_has_agent_loop_output_fields(result):
    rows = adapters.to_verl(result.trajectories)
    assert len(rows) == len(result.trajectories)
    for row, t in zip(rows, result.trajectories):
        assert set(row) == VERL_AGENT_LOOP_OUTPUT_FIELDS
        n = len(row["response_ids"])
        assert len(row["response_mask"]) == n and len(row["response_logprobs"]) == n
        assert row["prompt_ids"] == t["prompt_ids"]
        assert row["reward_score"] == t["reward"]
        assert row["num_turns"] == t["num_turns"]
        assert set(row["extra_fields"]) >= {"prompt_uid", "tree_id", "leaf_id", "node_path", "advantage"}
        assert all(m in (0, 1) for m in row["response_mask"])


def test_to_verl_rejects_rows_of_unequal_length(result):
    bad = dict(result.trajectories[0])
    bad["response_mask"] = bad["response_mask"][:-1]
    with pytest.raises(ValueError, match="differ in length"):
        adapters.to_verl([bad])


def test_trl_rollout_func_contract(engine):
    func = adapters.trl_rollout_func(
        engine,
        CalcTask,
        make_sample=lambda p: {"question": p, "target": 51},
        trees=2,
        expand=2,
        rounds=1,
        max_turns=1,
        max_step_tokens=16,
    )
    prompts = ["What is 17 * 3?"] * 6 + ["What is 50 + 1?"] * 6  # num_generations = 6
    out = func(prompts, None)
    assert set(out) >= TRL_ROLLOUT_FUNC_FIELDS | TRL_OPTIONAL_FIELDS
    for key in out:
        assert len(out[key]) == len(prompts), key
    for i in range(len(prompts)):
        n = len(out["completion_ids"][i])
        assert len(out["logprobs"][i]) == n and len(out["env_mask"][i]) == n
        assert out["prompt_ids"][i]
    assert out["prompt_ids"][0] != out["prompt_ids"][6]  # rows follow their prompts


def test_trl_rollout_func_needs_num_generations_equal_to_the_leaf_count(engine):
    func = adapters.trl_rollout_func(
        engine, CalcTask, make_sample=lambda p: {"question": p, "target": 1}, chains=2, max_turns=1, max_step_tokens=8
    )
    with pytest.raises(ValueError, match="num_generations"):
        func(["What is 0 + 1?"] * 3, None)


def test_numpy_arrays_on_request(result):
    np = pytest.importorskip("numpy")
    [row] = adapters.to_verl(result.trajectories[:1], as_numpy=True)
    assert isinstance(row["response_ids"], np.ndarray) and row["response_ids"].dtype == np.int64
    assert row["response_logprobs"].dtype == np.float32
