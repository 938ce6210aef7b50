"""treegrpo: Tree-GRPO rollouts for LLM agents on an inference engine whose KV cache
forks shared prefixes instead of recomputing them.

- :class:`Engine` — the engine (generate, ``await agenerate``, sessions, weights, stats).
- :class:`Session` — one sequence kept in the engine: generate, append, fork.
- :func:`rollout` — tree (or chain) rollouts over a built-in task or a Python environment.
- :func:`update` — one policy-gradient update of a model into a new checkpoint.
- :class:`Trainer` — the training loop: rollouts → advantages → update → weight swap.
- :mod:`treegrpo.adapters` — trajectories in verl's and TRL's shapes.

Everything heavy runs in Rust with the GIL released; Ctrl-C raises
``KeyboardInterrupt`` promptly and leaves the engine usable.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from . import _treegrpo
from ._treegrpo import Engine, Generation, Session, Tokenizer, __version__

__all__ = [
    "Engine",
    "Generation",
    "Session",
    "Tokenizer",
    "RolloutResult",
    "Trainer",
    "rollout",
    "update",
    "__version__",
]


@dataclass
class RolloutResult:
    """What :func:`rollout` returns: the fields of ``treegrpo rollout --out``'s files.

    ``trajectories``: one dict per leaf, as the lines of ``trajectories.jsonl``
    (``prompt_ids``, ``response_ids``, ``response_mask``, ``response_logprobs``,
    ``reward``, ``advantage``, ``num_turns``, ``prompt_uid``, ``tree_id``, ``leaf_id``,
    ``node_path``, ``score``, ``temperature``). ``forests``: one dict per tree, as the
    lines of ``forest.jsonl``. ``summary``: ``summary.json`` (token counts, rewards,
    failed branches).
    """

    trajectories: List[Dict[str, Any]] = field(default_factory=list)
    forests: List[Dict[str, Any]] = field(default_factory=list)
    summary: Dict[str, Any] = field(default_factory=dict)


def rollout(
    engine: Engine,
    env: Union[str, Callable[[], Any]],
    samples: Union[int, Sequence[Any]],
    trees: int = 2,
    expand: int = 2,
    rounds: int = 1,
    keep: Optional[int] = None,
    select: str = "paper",
    chains: Optional[int] = None,
    seed: int = 0,
    advantage: Optional[str] = None,
    max_turns: int = 3,
    max_step_tokens: int = 256,
    temperature: float = 1.0,
    branch_sampling: Optional[str] = None,
    token_budget: Optional[int] = None,
    max_concurrent_prompts: int = 16,
    env_timeout: float = 30.0,
    progress: Optional[Callable[[Dict[str, Any]], None]] = None,
    prompt_offset: int = 0,
) -> RolloutResult:
    """Tree-GRPO rollouts of ``samples`` in ``env`` on ``engine``.

    ``env``: a built-in task by name (``"search-qa"``, ``"calc"``; ``samples`` an int
    N for its first N training samples, or task sample dicts), or a Python class (or
    factory) whose instances are one episode each::

        class MyEnv:
            stop = ["</tool>"]              # optional: strings that end a step
            def reset(self, sample) -> list[dict]: ...   # chat messages
            def step(self, action_text) -> tuple[str | None, bool, float]: ...
                                             # (observation, done, reward)

    Both methods may be ``async def``. A branch forked at a node continues from
    ``copy.deepcopy`` of the node's episode object. An exception, a bad return value
    or a call past ``env_timeout`` seconds ends that branch with the error recorded
    in ``summary["forests"][i]["failed_branches"]``, never the run. An episode ends
    when ``step`` says done or after ``max_turns + 1`` steps; its reward is the last
    one ``step`` returned.

    Shape: M=``trees`` per prompt, N=``expand`` branches per tree per round,
    L=``rounds``, K=``keep`` leaves kept per tree; ``chains=G`` for G independent
    chains (GRPO). ``advantage``: tree, tree-2norm, inter, intra or grpo (default:
    tree for trees, grpo for chains). The same seed gives the same trajectories.

    ``branch_sampling``: draw each branch's first tokens from a wider distribution
    (diversity at the fork; root chains never), a spec string — ``t<T>`` temperature,
    ``k<K>`` top-k, ``p<P>`` top-p, ``n<N>`` first tokens (default 1) or ``s`` the
    whole first step, ``q<Q>`` the probability a branch is boosted — e.g. ``"t2"``,
    ``"t1.5p0.95s"``, ``"treerl"`` (= ``"t5k16q0.5"``). Each trajectory then carries
    ``response_behaviour_logprobs`` (the distribution each token was drawn from) and
    ``response_boosted`` beside ``response_logprobs`` (the policy's).

    ``prompt_offset``: the index of the first sample in a larger run this call is a
    part of. Seeds derive from the seed and the prompt's index in that run (and the
    tree and branch), so ``rollout(engine, env, samples[k:k+1], prompt_offset=k)``
    gives exactly the trajectories of prompt ``k`` in ``rollout(engine, env,
    samples)``; with a built-in task and an int N, the samples are the task's
    ``prompt_offset`` .. ``prompt_offset + N - 1``. This is how
    :class:`treegrpo.ray.RolloutPool` spreads one run over replicas.
    """
    options = dict(
        trees=trees,
        expand=expand,
        rounds=rounds,
        keep=keep,
        select=select,
        chains=chains,
        seed=seed,
        advantage=advantage,
        max_turns=max_turns,
        max_step_tokens=max_step_tokens,
        temperature=temperature,
        branch_sampling=branch_sampling,
        token_budget=token_budget,
        max_concurrent_prompts=max_concurrent_prompts,
        env_timeout=env_timeout,
        progress=progress,
        prompt_offset=prompt_offset,
    )
    if isinstance(env, str):
        return RolloutResult(**_treegrpo.rollout(engine, env, samples, **options))
    if not isinstance(samples, list):
        samples = list(samples) if not isinstance(samples, int) else samples
    with _EnvLoop() as loop:
        out = _treegrpo.rollout(engine, env, samples, event_loop=loop, **options)
    return RolloutResult(**out)


class _EnvLoop:
    """An asyncio loop in a thread of its own, where a Python environment's
    ``async def`` methods run: concurrently, whatever the caller's thread does."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="treegrpo-env-loop", daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()

    def __enter__(self) -> asyncio.AbstractEventLoop:
        return self.loop

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Trainer:
    """The training loop of ``treegrpo train`` on ``engine``: each step samples
    rollouts from the policy the engine serves, computes advantages, makes one update
    and swaps the new weights into the engine (weight version 1, 2, ...).

    ``env``: a built-in task name (``train``/``test`` default to its splits; ints
    take the first N) or a Python environment class as for :func:`rollout`
    (``train`` and ``test`` lists of samples). ``out_dir`` gets ``log.jsonl`` and
    ``checkpoint/``. Options: ``steps``, ``prompts_per_step``, the tree shape of
    :func:`rollout` (``trees``, ``expand``, ``rounds``, ``keep``, ``select``,
    ``chains``, ``seed``, ``advantage``, ``max_turns``, ``max_step_tokens``,
    ``temperature``, ``branch_sampling``), ``boosted_tokens`` ("corrected": the
    branch sampling's boosted tokens are importance-weighted against the
    distribution they were drawn from; "masked": left out of the loss),
    ``eval_every``/``eval_prompts`` (greedy eval on ``test``),
    ``checkpoint_every``, ``serve_format`` ("f32" or "bf16"), ``kl_reference``
    ("previous": the policy before each step, whose one-step KL is 0; "start": a
    frozen copy of the starting weights, kept in ``out_dir/reference/`` and read
    back by :meth:`resume`, which must be given the same choice) and the update
    options of :func:`update` (``lr``, ``kl_coef``, ...). The trainer's weights
    start from the engine's model file. An ``out_dir`` that holds a run already
    (its ``log.jsonl`` or checkpoint) is kept: :meth:`run` on a fresh trainer
    refuses it, :meth:`resume` continues it, and ``overwrite=True`` starts over
    (deleting its log and checkpoints).
    """

    def __init__(self, engine: Engine, env: Any, out_dir: str, **options: Any) -> None:
        self._loop: Optional[_EnvLoop] = None
        if not isinstance(env, str):
            self._loop = _EnvLoop()
            options["event_loop"] = self._loop.loop
        try:
            self._inner = _treegrpo.Trainer(engine, env, str(out_dir), **options)
        except BaseException:
            self.close()
            raise

    def run(self, progress: Optional[Callable[[Dict[str, Any]], None]] = None) -> List[Dict[str, Any]]:
        """Runs the remaining steps; returns every step's ``log.jsonl`` line. Ctrl-C
        stops at the next point that loses nothing, then raises KeyboardInterrupt.

        ``progress`` gets a dict per event: ``{"event": "rollout", "step", "wave",
        "prompts_done", "prompts"}`` as each rollout wave starts (``prompts_done``
        0; a step under a token budget runs several waves) and as each prompt
        finishes; ``"update"`` (``micro_batches_done``, ``micro_batches``),
        ``"evaluating"``, ``"step"`` (``line``: the log line) and ``"checkpoint"``
        (``dir``)."""
        return self._inner.run(progress)

    def resume(self) -> int:
        """Continues from the last checkpoint under ``out_dir``; returns its step."""
        return self._inner.resume()

    @property
    def step(self) -> int:
        """Steps completed so far."""
        return self._inner.step

    @property
    def config(self) -> Dict[str, Any]:
        """The run's settings as the keywords resolved them (the document
        ``treegrpo train --print-config`` prints for its flags)."""
        import json

        return json.loads(self._inner.config)

    def close(self) -> None:
        """Stops the environment's event loop (a Python environment's)."""
        if self._loop is not None:
            self._loop.close()
            self._loop = None

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def update(
    model_path: Optional[str],
    trajectories: Union[str, Sequence[Dict[str, Any]]],
    out_dir: str,
    **loss_options: Any,
) -> Dict[str, Any]:
    """One policy-gradient update of ``model_path`` (None: the default model) on
    ``trajectories`` (the dicts :func:`rollout` returns, or a ``trajectories.jsonl``
    path), written as an HF checkpoint to ``out_dir``; returns ``treegrpo update``'s
    metrics (loss, pg_loss, kl, entropy, grad_norm, clip_fraction, ...).

    Options, with ``treegrpo update``'s defaults: lr=1e-6, optimizer="adamw",
    weight_decay=0.01, warmup_steps=0, clip_low=0.2, clip_high=0.2, clip_c=3.0,
    loss_agg="token-mean", kl_coef=0.001, entropy_coef=0.001, tis_cap=2.0,
    max_grad_norm=1.0, packed=True, micro_batch_tokens=4096. Serve the result with
    ``engine.load_weights(out_dir)``.
    """
    return _treegrpo.update(model_path, trajectories, out_dir, **loss_options)
