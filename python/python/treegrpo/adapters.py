"""Trajectories in the shapes trainers consume, without importing torch.

- :func:`to_verl` — one dict per trajectory with the 12 fields of verl 0.9.1's
  ``AgentLoopOutput`` (``verl/experimental/agent_loop/agent_loop.py``).
- :class:`TokenOutput` — what ``await Engine.agenerate(...)`` returns: the fields of
  verl 0.9.1's ``TokenOutput`` (``verl/workers/rollout/replica.py``), the result of
  its rollout servers' ``generate``.
- :func:`trl_rollout_func` — a callable with TRL's ``rollout_func(prompts, trainer)``
  contract (``GRPOTrainer(rollout_func=...)``): ``prompt_ids``, ``completion_ids``,
  ``logprobs`` and ``env_mask`` per completion, plus ``reward``, ``advantage`` and
  ``weight_version`` extra columns for reward functions; it copies the trainer's
  weights into the engine after every optimiser step.

Both give trainers the **behaviour** log-probabilities as the rollout's (verl's
``response_logprobs``, TRL's ``logprobs``): the distribution each token was drawn
from, which their importance-sampling corrections divide by. They equal the policy's
except where a branch sampling (``branch_sampling=...``) boosted a branch's first
tokens; verl's ``extra_fields`` then also carry the policy's (``policy_logprobs``)
and the boosted-token flags (``boosted``).

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


def _behaviour(t: Dict[str, Any]) -> List[float]:
    """The trajectory's behaviour logprobs (records written before they were kept
    have none: then the policy's, which they were)."""
    return t.get("response_behaviour_logprobs") or t["response_logprobs"]


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
        behaviour = _behaviour(t)
        if len(t["response_mask"]) != n or len(t["response_logprobs"]) != n or len(behaviour) != n:
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
                "response_logprobs": _array(behaviour, as_numpy, "float32"),
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
                    "policy_logprobs": _array(t["response_logprobs"], as_numpy, "float32"),
                    "boosted": _array(t.get("response_boosted") or [0] * n, as_numpy, "int64"),
                },
                "mm_processor_kwargs": None,
                "mm_processor_output": None,
            }
        )
    return out


def leaves_per_prompt(
    trees: int = 2,
    expand: int = 2,
    rounds: int = 1,
    keep: Optional[int] = None,
    chains: Optional[int] = None,
    **_: Any,
) -> int:
    """The leaf count of one prompt's forest under :func:`treegrpo.rollout`'s shape
    arguments: G for ``chains=G``; M·(1 + N·L) for ``trees=M, expand=N, rounds=L``
    (each round adds N leaves per tree), M·min(K, 1 + N·L) with ``keep=K``."""
    if chains is not None:
        return chains
    per_tree = 1 + expand * rounds
    if keep is not None:
        per_tree = min(keep, per_tree)
    return trees * per_tree


def _shapes_for(count: int) -> List[str]:
    """A few tree shapes whose forests have ``count`` leaves per prompt."""
    shapes = []
    for m in range(1, count + 1):
        for n in range(1, 5):
            for l in range(1, 4):
                if m * (1 + n * l) == count:
                    shapes.append(f"trees={m}, expand={n}, rounds={l}")
    return shapes[:4] + [f"chains={count}"]


def _leaf_count_error(count: int, tree_config: Dict[str, Any], leaves: int) -> ValueError:
    shape = ", ".join(
        f"{k}={tree_config[k]}" for k in ("trees", "expand", "rounds", "keep", "chains") if tree_config.get(k) is not None
    ) or "the default trees=2, expand=2, rounds=1"
    return ValueError(
        f"num_generations is {count}, but the tree shape ({shape}) grows {leaves} leaves per "
        f"prompt (M*(1+N*L) for trees=M, expand=N, rounds=L; M*K with keep=K; G with "
        f"chains=G). Set num_generations={leaves}, or use a shape with {count} leaves: "
        + "; ".join(_shapes_for(count))
    )


def _trainer_num_generations(trainer: Any) -> Optional[int]:
    """The group size TRL repeats each prompt by: the trainer's ``num_generations``
    (``num_generations_eval`` while evaluating), else its args'."""
    if trainer is None:
        return None
    training = getattr(getattr(trainer, "model", None), "training", True)
    for owner in (trainer, getattr(trainer, "args", None)):
        if owner is None:
            continue
        if not training and getattr(owner, "num_generations_eval", None):
            return int(owner.num_generations_eval)
        if getattr(owner, "num_generations", None):
            return int(owner.num_generations)
    return None


def _policy_state_dict(trainer: Any) -> Any:
    """The trainer's current weights by HF name (the model unwrapped from
    accelerate's wrappers, if the trainer has an accelerator)."""
    model = trainer.model
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is not None:
        model = accelerator.unwrap_model(model)
    return model.state_dict()


def trl_rollout_func(
    engine: Any,
    env: Any,
    make_sample: Optional[Callable[[Any], Any]] = None,
    *,
    sync_weights: bool = True,
    as_numpy: bool = False,
    **tree_config: Any,
) -> Callable[[List[Any], Any], Dict[str, List[Any]]]:
    """A ``rollout_func(prompts, trainer)`` for TRL's ``GRPOTrainer``.

    TRL passes each prompt ``trainer.num_generations`` times in a row (its
    ``RepeatSampler`` repeats them, whatever 1.16's ``rollout_func`` docstring says
    about duplication) and wants one row back per row given; each prompt is rolled
    out once as a forest (``tree_config``: the arguments of
    :func:`treegrpo.rollout` after ``samples``: ``trees``, ``expand``, ``rounds``,
    ``keep``, ``chains``, ``max_turns``, ``max_step_tokens``, ``temperature``, ...),
    and its leaves fill its rows, so ``num_generations`` must equal the forest's leaf
    count (:func:`leaves_per_prompt`): M·(1 + N·L) for trees (M·K with ``keep=K``),
    G for ``chains=G``; a mismatch fails before any rollout, naming shapes that fit.
    ``make_sample(prompt)`` turns a prompt into the environment's sample (default
    ``{"prompt": prompt}``; for a built-in task, a dict with ``question`` and
    ``golden_answers``).

    ``sync_weights``: on the first call and whenever ``trainer.state.global_step``
    changed since the last sync, the trainer's current weights
    (``trainer.model.state_dict()``, unwrapped from accelerate) are copied into the
    engine with :meth:`treegrpo.Engine.load_state_dict`, as weight version
    ``global_step + 1`` (0 is the engine's own starting weights; the next version if
    the engine is already past it). TRL syncs weights only into vLLM, so on this path
    the rollout function does it.

    Returns, per row: ``prompt_ids``, ``completion_ids``, ``logprobs`` and
    ``env_mask`` (1 on model tokens, 0 on environment tokens, TRL's convention), and
    the extra columns ``reward``, ``advantage`` and ``weight_version``, which TRL
    hands to reward functions as keyword arguments.

    **Tree-GRPO's advantages in TRL's loss.** TRL computes advantages as a reward
    minus its group's mean (divided by the group's std unless
    ``scale_rewards="none"``). Give TRL one reward function that returns the
    ``advantage`` column, with ``GRPOConfig(scale_rewards="none")``::

        def tree_advantage(prompts, completions, advantage, **_):
            return advantage

    A forest's Tree-GRPO advantages sum to zero over its leaves (each of the two
    terms is a deviation from a mean over the leaves: a tree's, which sums to zero
    per tree, and the forest's), so the group mean TRL subtracts is zero and the
    advantages reach the loss unchanged. (With the default ``scale_rewards`` TRL
    would rescale them by their std.) Each leaf's advantage then weighs every model
    token of its root-to-leaf path, as in the paper; TRL's loss does not share
    prefixes, it scores each leaf's tokens on its own.
    """
    from . import rollout

    to_sample = make_sample or (lambda p: {"prompt": p})
    expected = leaves_per_prompt(**tree_config)
    synced: Dict[str, Any] = {"step": None}

    def sync(trainer: Any) -> None:
        step = int(trainer.state.global_step)
        if synced["step"] == step:
            return
        wanted = step + 1
        version = wanted if wanted > engine.weight_version else None
        engine.load_state_dict(_policy_state_dict(trainer), version)
        synced["step"] = step

    def groups_of(prompts: List[Any], size: Optional[int]) -> List[List[int]]:
        if size is None:
            # No trainer: consecutive equal prompts are one group.
            groups: List[List[int]] = []
            for i, p in enumerate(prompts):
                if groups and prompts[groups[-1][0]] == p:
                    groups[-1].append(i)
                else:
                    groups.append([i])
            return groups
        if len(prompts) % size:
            raise ValueError(
                f"{len(prompts)} prompts is not a whole number of groups of num_generations={size}"
            )
        groups = [list(range(i, i + size)) for i in range(0, len(prompts), size)]
        for g in groups:
            if any(prompts[i] != prompts[g[0]] for i in g):
                raise ValueError(
                    f"rows {g[0]}..{g[-1]} are not one prompt repeated num_generations={size} times"
                )
        return groups

    def rollout_func(prompts: List[Any], trainer: Any = None) -> Dict[str, List[Any]]:
        size = _trainer_num_generations(trainer)
        if size is not None and size != expected:
            raise _leaf_count_error(size, tree_config, expected)
        if sync_weights and trainer is not None:
            sync(trainer)
        groups = groups_of(prompts, size)
        samples = []
        for g, rows in enumerate(groups):
            sample = to_sample(prompts[rows[0]])
            if isinstance(sample, dict):
                sample = dict(sample)
                sample.setdefault("id", str(g))
            samples.append(sample)
        result = rollout(engine, env, samples, **tree_config)
        version = int(result.summary.get("weight_version", engine.weight_version))
        eos = engine.tokenizer.eos_token_ids[0]
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
            "weight_version": [],
        }
        for g, rows in enumerate(groups):
            uid = samples[g]["id"] if isinstance(samples[g], dict) else str(g)
            leaves = by_prompt.get(str(uid), [])
            if len(leaves) != len(rows):
                if size is None:  # no trainer: the rows were counted from the prompts
                    raise _leaf_count_error(len(rows), tree_config, len(leaves))
                failed = result.summary.get("failed_branches", 0)
                raise ValueError(
                    f"prompt {g}'s forest has {len(leaves)} leaves, not the {len(rows)} its "
                    f"tree shape grows ({failed} failed branches in the rollout, listed in "
                    "its summary's forests; a token_budget also stops branches)"
                )
            for t in leaves:
                ids, logprobs, mask = t["response_ids"], _behaviour(t), t["response_mask"]
                if not ids:
                    # The leaf's first sampled token was a stop token (not kept in a
                    # trajectory); TRL reads every completion's last token, so it gets
                    # the stop token, masked out of the loss.
                    ids, logprobs, mask = [eos], [0.0], [0]
                out["prompt_ids"].append(_array(t["prompt_ids"], as_numpy, "int64"))
                out["completion_ids"].append(_array(ids, as_numpy, "int64"))
                out["logprobs"].append(_array(logprobs, as_numpy, "float32"))
                out["env_mask"].append(_array(mask, as_numpy, "int64"))
                out["reward"].append(float(t["reward"]))
                out["advantage"].append(float(t["advantage"]))
                out["weight_version"].append(version)
        return out

    return rollout_func
