"""One run's result from its prompts' results: what :class:`RolloutPool` returns is
shaped as :func:`treegrpo.rollout`'s, whichever replica rolled out which prompt.

Each prompt is rolled out by one call on one replica; this module concatenates the
calls' trajectories and trees in prompt order and adds their summaries up (token
counts, tool calls, failed branches), recomputing what is a ratio (mean reward,
tokens per rollout, tokens per second) over the whole run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from .. import RolloutResult


@dataclass
class PromptResult:
    """One prompt's rollout: the call's result, the replica slot that made it and
    the Ray node that replica ran on, how many calls it took (more than one after a
    replica died), and the seconds from sending its last call to having its result
    (the replica's run plus what Ray and the call's wrapping add)."""

    result: RolloutResult
    replica: int
    attempts: int
    call_seconds: float
    node_id: Optional[str] = None


def add_tokens(total: Dict[str, int], part: Dict[str, int]) -> None:
    for key, value in part.items():
        total[key] = total.get(key, 0) + value


def merge(
    prompts: int,
    finished: Dict[int, PromptResult],
    wall_seconds: float,
    weight_version: int,
    pool: Dict[str, Any],
    token_budget: Optional[int],
    budget_exhausted: bool,
) -> RolloutResult:
    """The run's result from ``finished`` (prompt index → its result), in prompt
    order. ``pool`` goes into ``summary["pool"]`` (replicas, deaths, re-runs);
    ``token_budget`` is the pool's (checked between prompts, not by the replicas)."""
    trajectories: List[Dict[str, Any]] = []
    forests: List[Dict[str, Any]] = []
    forest_summaries: List[Dict[str, Any]] = []
    tokens: Dict[str, int] = {}
    shared: Dict[str, int] = {}
    first: Optional[Dict[str, Any]] = None
    peak_kv = 0
    kv_pool = 0
    tool_calls = 0
    for index in sorted(finished):
        part = finished[index]
        s = part.result.summary
        first = first or s
        trajectories.extend(part.result.trajectories)
        forests.extend(part.result.forests)
        add_tokens(tokens, s["tokens"])
        add_tokens(shared, s["shared_prefix"])
        peak_kv = max(peak_kv, s["peak_kv_bytes"])
        kv_pool = max(kv_pool, s["kv_pool_bytes"])
        tool_calls += s["tool_calls"]
        for f in s["forests"]:
            forest_summaries.append(
                dict(
                    f,
                    replica=part.replica,
                    node_id=part.node_id,
                    weight_version=s["weight_version"],
                    attempts=part.attempts,
                    call_seconds=part.call_seconds,
                )
            )
    rollouts = len(trajectories)
    computed = tokens.get("computed", 0)
    summary: Dict[str, Any] = {
        "prompts": prompts,
        "prompts_finished": len(finished),
        "rollouts": rollouts,
        "mean_reward": (
            sum(t["reward"] for t in trajectories) / rollouts if rollouts else 0.0
        ),
        "tokens": tokens,
        "tokens_computed_per_rollout": computed / rollouts if rollouts else 0.0,
        "computed_tokens_per_second": computed / max(wall_seconds, 1e-9),
        "tool_calls": tool_calls,
        "failed_branches": sum(len(f["failed_branches"]) for f in forest_summaries),
        "wall_seconds": wall_seconds,
        # Per replica: each has its own KV pool.
        "peak_kv_bytes": peak_kv,
        "kv_pool_bytes": kv_pool,
        "weight_version": weight_version,
        "token_budget": token_budget,
        "budget_exhausted": budget_exhausted,
        # A pool's rollout is never interrupted with a result (Ctrl-C raises).
        "interrupted": False,
        "shared_prefix": shared,
        "forests": forest_summaries,
        "pool": pool,
    }
    if first is not None:
        for key in ("config", "advantage"):
            summary[key] = first[key]
    return RolloutResult(trajectories=trajectories, forests=forests, summary=summary)
