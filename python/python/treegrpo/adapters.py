"""Trajectories in the shapes trainers consume, without importing torch.

- :func:`to_verl` — one dict per trajectory with the 12 fields of verl 0.9.1's
  ``AgentLoopOutput`` (``verl/experimental/agent_loop/agent_loop.py``).
- :class:`TokenOutput` — what ``await Engine.agenerate(...)`` returns: the fields of
  verl 0.9.1's ``TokenOutput`` (``verl/workers/rollout/replica.py``), the result of
  its rollout servers' ``generate``.
- :func:`trl_rollout_func` — a callable with TRL's ``rollout_func(prompts, trainer)``
  contract (``GRPOTrainer(rollout_func=...)``): ``prompt_ids``, ``completion_ids``,
  ``logprobs`` and ``env_mask`` per completion, plus ``reward`` and ``advantage``
  extra columns for reward functions.

``as_numpy=True`` gives numpy arrays instead of lists (numpy is imported only then).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

# The per-token fields that must each be as long as ``response_ids``.
VERL_TOKEN_FIELDS = ("response_ids", "response_mask", "response_logprobs")


@dataclass
class TokenOutput:
    """One generation as verl's rollout servers return it (verl 0.9.1's
    ``TokenOutput``); verl's agent loops read it by attribute and add to
    ``extra_fields``.

    ``token_ids``: the generated tokens (a stop token that ended it is not
    included). ``log_probs``: each token's natural-log probability under the
    sampling distribution. ``routed_experts``: None (a dense model).
    ``stop_reason``: ``"completed"`` (verl's word for vLLM's ``stop`` and
    ``length``; ``"aborted"`` and None are the other values verl knows).
    ``num_preempted``: the times the request's sequence was preempted (its KV
    dropped under memory pressure, then recomputed) while it generated. ``extra_fields``: ``weight_version`` (the weights every
    token was sampled under) and ``finish_reason`` (``"stop"`` or ``"length"``).
    """

    token_ids: List[int]
    log_probs: Optional[List[float]] = None
    routed_experts: Any = None
    stop_reason: Optional[str] = None
    num_preempted: Optional[int] = None
    extra_fields: Dict[str, Any] = field(default_factory=dict)


def _array(values: Sequence[Any], as_numpy: bool, dtype: str) -> Any:
    if not as_numpy:
        return list(values)
    import numpy as np

    return np.asarray(values, dtype=dtype)


def to_verl(trajectories: Sequence[Dict[str, Any]], as_numpy: bool = False) -> List[Dict[str, Any]]:
    """verl 0.9.1 ``AgentLoopOutput`` fields (all 12) for each trajectory of
    :func:`treegrpo.rollout`.

    ``response_mask`` is 1 on model tokens and 0 on observation tokens (verl's
    convention); ``reward_score`` is the trajectory's reward; ``extra_fields`` carries
    the tree ids and Tree-GRPO's advantage, so a trainer can use the tree's
    step-level credit instead of recomputing group advantages. The fields of
    mixture-of-experts and multi-modal models (``routed_experts``,
    ``multi_modal_data``, ``mm_processor_kwargs``, ``mm_processor_output``) are
    None, verl's defaults: the engine serves dense text-only models.
    """
    out = []
    for t in trajectories:
        n = len(t["response_ids"])
        if len(t["response_mask"]) != n or len(t["response_logprobs"]) != n:
            raise ValueError(
                f"trajectory {t.get('prompt_uid')}/{t.get('tree_id')}/{t.get('leaf_id')}: "
                "response_ids, response_mask and response_logprobs differ in length"
            )
        score = t.get("score") or {}
        details = score.get("details") or {}
        out.append(
            {
                "prompt_ids": _array(t["prompt_ids"], as_numpy, "int64"),
                "response_ids": _array(t["response_ids"], as_numpy, "int64"),
                "response_mask": _array(t["response_mask"], as_numpy, "int64"),
                "response_logprobs": _array(t["response_logprobs"], as_numpy, "float32"),
                "routed_experts": None,
                "multi_modal_data": None,
                "reward_score": float(t["reward"]),
                "num_turns": int(t["num_turns"]),
                "metrics": {"tool_calls": float(details.get("tool_calls", 0))},
                "extra_fields": {
                    "prompt_uid": t["prompt_uid"],
                    "tree_id": t["tree_id"],
                    "leaf_id": t["leaf_id"],
                    "node_path": list(t["node_path"]),
                    "advantage": float(t["advantage"]),
                    "temperature": t.get("temperature"),
                },
                "mm_processor_kwargs": None,
                "mm_processor_output": None,
            }
        )
    return out


def trl_rollout_func(
    engine: Any,
    env: Any,
    make_sample: Optional[Callable[[Any], Any]] = None,
    as_numpy: bool = False,
    **tree_config: Any,
) -> Callable[[List[Any], Any], Dict[str, List[Any]]]:
    """A ``rollout_func(prompts, trainer)`` for TRL's ``GRPOTrainer``.

    TRL passes each prompt ``num_generations`` times in a row; each distinct prompt is
    rolled out once as a forest (``tree_config``: the arguments of
    :func:`treegrpo.rollout` after ``samples``), and its leaves fill its rows, so
    ``num_generations`` must equal the forest's leaf count: M·(1 + N·L) for trees
    (M·K with ``keep=K``), G for ``chains=G``. ``make_sample(prompt)`` turns a prompt
    into the environment's sample (default ``{"prompt": prompt}``).

    Returns ``prompt_ids``, ``completion_ids``, ``logprobs`` and ``env_mask`` (1 on
    model tokens, 0 on environment tokens, TRL's convention) per row, and the extra
    columns ``reward`` and ``advantage``, which TRL hands to reward functions.
    """
    from . import rollout

    to_sample = make_sample or (lambda p: {"prompt": p})

    def rollout_func(prompts: List[Any], trainer: Any = None) -> Dict[str, List[Any]]:
        groups: List[List[int]] = []
        for i, p in enumerate(prompts):
            if groups and prompts[groups[-1][0]] == p:
                groups[-1].append(i)
            else:
                groups.append([i])
        samples = []
        for g, rows in enumerate(groups):
            sample = to_sample(prompts[rows[0]])
            if isinstance(sample, dict):
                sample = dict(sample)
                sample.setdefault("id", str(g))
            samples.append(sample)
        result = rollout(engine, env, samples, **tree_config)
        by_prompt: Dict[str, List[Dict[str, Any]]] = {}
        for t in result.trajectories:
            by_prompt.setdefault(t["prompt_uid"], []).append(t)
        out: Dict[str, List[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            "env_mask": [],
            "reward": [],
            "advantage": [],
        }
        for g, rows in enumerate(groups):
            uid = samples[g]["id"] if isinstance(samples[g], dict) else str(g)
            leaves = by_prompt.get(str(uid), [])
            if len(leaves) != len(rows):
                raise ValueError(
                    f"prompt {g} was given {len(rows)} times (num_generations) but its "
                    f"forest has {len(leaves)} leaves: set num_generations to the tree "
                    "shape's leaf count, M*(1+N*L) (M*K with keep=K, G with chains=G)"
                )
            for t in leaves:
                out["prompt_ids"].append(_array(t["prompt_ids"], as_numpy, "int64"))
                out["completion_ids"].append(_array(t["response_ids"], as_numpy, "int64"))
                out["logprobs"].append(_array(t["response_logprobs"], as_numpy, "float32"))
                out["env_mask"].append(_array(t["response_mask"], as_numpy, "int64"))
                out["reward"].append(float(t["reward"]))
                out["advantage"].append(float(t["advantage"]))
        return out

    return rollout_func
