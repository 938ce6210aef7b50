"""The adapters' outputs against the field lists of verl's `AgentLoopOutput` and
`TokenOutput` and TRL's `rollout_func` contract, written out here from those
projects' sources (verl 0.9.1, TRL 1.16), so a drift on either side fails here."""

import asyncio
import dataclasses

import pytest

import treegrpo
from treegrpo import adapters

from test_rollout import SAMPLES, CalcTask

# verl 0.9.1, verl/experimental/agent_loop/agent_loop.py, class AgentLoopOutput(BaseModel).
VERL_AGENT_LOOP_OUTPUT_FIELDS = {
    "prompt_ids",
    "response_ids",
    "response_mask",
    "response_logprobs",
    "routed_experts",
    "multi_modal_data",
    "reward_score",
    "num_turns",
    "metrics",
    "extra_fields",
    "mm_processor_kwargs",
    "mm_processor_output",
}
# verl 0.9.1, verl/workers/rollout/replica.py, class TokenOutput(BaseModel): what
# the rollout servers' `generate` returns.
VERL_TOKEN_OUTPUT_FIELDS = {
    "token_ids",
    "log_probs",
    "routed_experts",
    "stop_reason",
    "num_preempted",
    "extra_fields",
}
# TokenOutput.stop_reason: "completed", "aborted", or None for unknown. verl's vLLM
# server maps vLLM's finish reasons "stop" and "length" to "completed".
VERL_STOP_REASONS = {"completed", "aborted", None}
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
        # A dense text-only model: verl's defaults for the MoE and multi-modal fields.
        for key in ("routed_experts", "multi_modal_data", "mm_processor_kwargs", "mm_processor_output"):
            assert row[key] is None, key


def test_token_output_has_verl_token_output_fields():
    assert {f.name for f in dataclasses.fields(adapters.TokenOutput)} == VERL_TOKEN_OUTPUT_FIELDS


def test_agenerate_answers_as_a_verl_rollout_server(engine):
    ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}])

    async def main():
        # As verl's LLMServerClient calls its server: everything by keyword.
        by_keyword = await engine.agenerate(
            request_id="req-0",
            prompt_ids=ids,
            sampling_params={"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
                             "logprobs": True, "max_tokens": 4},
            image_data=None,
            video_data=None,
        )
        # The server's positional order (prompt_ids, sampling_params, request_id).
        positional = await engine.agenerate(ids, {"temperature": 1.0, "max_tokens": 4}, "req-0")
        return by_keyword, positional

    out, again = asyncio.run(main())
    assert isinstance(out, adapters.TokenOutput)
    assert {f.name for f in dataclasses.fields(out)} == VERL_TOKEN_OUTPUT_FIELDS
    assert 1 <= len(out.token_ids) <= 4 and len(out.log_probs) == len(out.token_ids)
    assert all(isinstance(t, int) for t in out.token_ids)
    assert all(lp <= 0.0 for lp in out.log_probs)
    assert out.stop_reason in VERL_STOP_REASONS and out.stop_reason == "completed"
    assert out.routed_experts is None and out.num_preempted == 0
    assert out.extra_fields["weight_version"] == engine.weight_version
    assert out.extra_fields["finish_reason"] in ("stop", "length")
    # The request id seeds the sampling: the same id, the same tokens, however called.
    assert again.token_ids == out.token_ids and again.log_probs == out.log_probs
    # verl's agent loop adds to extra_fields; a result pickles (Ray sends it back).
    out.extra_fields.setdefault("min_global_steps", None)
    import pickle

    assert pickle.loads(pickle.dumps(out)) == out


@pytest.mark.parametrize("kind", ["image_data", "video_data"])
def test_agenerate_refuses_multi_modal_data(engine, kind):
    async def main():
        return await engine.agenerate(request_id="r", prompt_ids=[1, 2, 3], sampling_params={}, **{kind: [b"x"]})

    with pytest.raises(ValueError, match=f"{kind}: .*text-only"):
        asyncio.run(main())


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
