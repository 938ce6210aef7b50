"""A pool of rollout replicas on Ray: :class:`RolloutPool`.

One call of :meth:`RolloutPool.rollout` is one run of :func:`treegrpo.rollout` spread
over the replicas. Each prompt is one remote call, so a prompt's whole forest grows on
one replica (its trees share the prompt's prefix cache and its branches fork
locally), and each replica runs several prompts at once on its engine. A prompt goes
to the live replica with the fewest prompts outstanding. Seeds derive from the
prompt's index in the run (``prompt_offset``), so a prompt gives the same trajectories
on any replica, and a prompt whose replica died (its process, or its whole node) is
re-run on another one with the same result.

Replicas are spread over the cluster's nodes (Ray's ``SPREAD`` strategy, best effort:
one per node while nodes have room), so losing a node loses as few replicas as can be.
"""

from __future__ import annotations

import inspect
import os
import time
import traceback
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple, Union

import ray
from ray.exceptions import (
    ActorUnschedulableError,
    NodeDiedError,
    ObjectLostError,
    RayActorError,
    RayTaskError,
    WorkerCrashedError,
)

import treegrpo

from .merge import PromptResult, merge
from .replica import RolloutReplica, thread_env

# The options of `treegrpo.rollout` after the engine, env and samples (the pool sets
# each call's `prompt_offset` and calls `progress` itself).
ROLLOUT_OPTIONS = frozenset(
    list(inspect.signature(treegrpo.rollout).parameters)[3:]
) - {"prompt_offset", "progress"}

# Most prompts in flight on one replica (each is a call running on one of the
# actor's threads); two more threads answer `info`, `stats` and `load_weights`.
MAX_PROMPTS_PER_REPLICA = 64

# What a call raises when its replica is gone (its process killed or crashed, its node
# lost, or the result lost with that node): the prompt is re-run elsewhere. An error
# the rollout itself raised (a bad option, the environment's exception) is not one.
REPLICA_LOST = (RayActorError, NodeDiedError, WorkerCrashedError, ObjectLostError)


class PoolError(RuntimeError):
    """The pool could not finish a rollout (every replica died). ``partial`` holds
    the prompts that did finish, as a :class:`treegrpo.RolloutResult`."""

    def __init__(self, message: str, partial: Optional[treegrpo.RolloutResult] = None):
        super().__init__(message)
        self.partial = partial


class ReplicaSlot:
    """One place in the pool: its actor (replaced after a death), its state
    (``"starting"``, ``"live"`` or ``"dead"``) and its prompts in flight."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.actor: Any = None
        self.state = "dead"
        self.outstanding = 0
        self.restarts = 0
        self.ready_ref: Any = None
        self.started_at = 0.0
        self.info: Dict[str, Any] = {}
        # A slot is restarted only once it served: a replica that cannot start at
        # all (a bad model path) fails the pool's construction instead.
        self.was_live = False
        self.last_error: Optional[str] = None


class RolloutPool:
    """``num_replicas`` :class:`RolloutReplica` actors serving one policy.

    ``model``: a .gguf file or an HF folder on storage every node sees (None: the
    default model, fetched by each node on first use). ``threads``: compute threads
    per replica; ``num_cpus`` (default ``threads``) is what each actor reserves from
    Ray. ``max_restarts``: how many times a slot's replica is replaced after it dies
    (a replacement loads the pool's current weights before it gets work);
    ``start_timeout``: seconds a replica may take to start before its slot is given
    up. ``actor_options``: more ``.options(...)`` for the actors (resources, a
    placement group's or a node's scheduling strategy, replacing the default
    ``"SPREAD"``: replicas on as many nodes as have room). ``engine_options``: the
    :class:`treegrpo.Engine`'s (``kv_mib``, ``max_batch_seqs``, ``seed``).

    Ray must be initialised (``ray.init()``, or ``ray.init(address=...)`` to join a
    cluster); a pool made without it initialises a local instance.
    """

    def __init__(
        self,
        num_replicas: int,
        model: Union[None, str, "os.PathLike[str]"] = None,
        threads: int = 1,
        *,
        num_cpus: Optional[float] = None,
        max_restarts: int = 3,
        start_timeout: float = 600.0,
        actor_options: Optional[Dict[str, Any]] = None,
        **engine_options: Any,
    ) -> None:
        if num_replicas < 1:
            raise ValueError("num_replicas must be at least 1")
        if threads < 1:
            raise ValueError("threads must be at least 1")
        if not ray.is_initialized():
            ray.init()
        self.model = os.path.abspath(os.fspath(model)) if model is not None else None
        self.threads = threads
        self.num_cpus = threads if num_cpus is None else num_cpus
        self.max_restarts = max_restarts
        self.start_timeout = start_timeout
        self.actor_options = dict(actor_options or {})
        self.engine_options = engine_options
        self.weight_version = 0
        # What new replicas load: a checkpoint path, or a state dict's object ref.
        self.weights: Any = None
        self.deaths = 0
        self.slots = [ReplicaSlot(i) for i in range(num_replicas)]
        for slot in self.slots:
            self._start(slot)
        self.wait_ready(self.start_timeout)
        if not self._live():
            errors = {s.last_error for s in self.slots if s.last_error}
            self.shutdown()
            raise PoolError(
                "no replica of the pool started: "
                + (
                    "; ".join(sorted(errors))
                    or f"none was ready after {self.start_timeout:.0f} s (each needs "
                    f"num_cpus={self.num_cpus}; the cluster has "
                    f"{ray.available_resources().get('CPU', 0)} CPUs free)"
                )
            )

    # ----- replicas -----

    def _start(self, slot: ReplicaSlot) -> None:
        """Starts a replica in ``slot``; it gets work once it serves the pool's policy."""
        options: Dict[str, Any] = dict(
            num_cpus=self.num_cpus,
            # Room for one prompt per concurrent call the pool makes, and for
            # `info`/`load_weights` beside them.
            max_concurrency=MAX_PROMPTS_PER_REPLICA + 2,
            max_restarts=0,
            runtime_env={"env_vars": thread_env(self.threads)},
        )
        options.update(self.actor_options)
        if "placement_group" not in options:
            # One replica per node while nodes have room: a lost node takes as few
            # replicas with it as can be, and a replacement lands on a live node.
            options.setdefault("scheduling_strategy", "SPREAD")
        actor_class = ray.remote(RolloutReplica)
        slot.actor = actor_class.options(**options).remote(
            self.model, self.threads, **self.engine_options
        )
        slot.state = "starting"
        slot.outstanding = 0
        slot.started_at = time.monotonic()
        slot.ready_ref = slot.actor.prepare.remote(self.weights, self.weight_version)

    def _mark_dead(self, slot: ReplicaSlot, actor: Any) -> None:
        """``actor`` (the one in ``slot`` when a call was made) died: replace it
        unless it was replaced already or the slot's restarts are spent."""
        if slot.actor is not actor or slot.state == "dead":
            return
        self.deaths += 1
        slot.state = "dead"
        slot.ready_ref = None
        try:
            ray.kill(actor)
        except Exception:
            pass
        if slot.was_live and slot.restarts < self.max_restarts:
            slot.restarts += 1
            self._start(slot)

    def _became_ready(self, slot: ReplicaSlot) -> None:
        """``slot``'s start finished: live if it serves the pool's policy."""
        actor = slot.actor
        try:
            slot.info = ray.get(slot.ready_ref)
        except (*REPLICA_LOST, ActorUnschedulableError) as e:
            # Unschedulable: its strategy names a node that is gone (node affinity).
            slot.last_error = _cause(e)
            self._mark_dead(slot, actor)
            return
        if slot.info["weight_version"] != self.weight_version:
            # Weights changed while it started: bring it up to date first.
            slot.ready_ref = actor.prepare.remote(self.weights, self.weight_version)
            return
        slot.ready_ref = None
        slot.state = "live"
        slot.was_live = True

    def _check_start_deadlines(self) -> None:
        for slot in self.slots:
            if (
                slot.state == "starting"
                and time.monotonic() - slot.started_at > self.start_timeout
            ):
                # It could not be scheduled or loaded in time: give the slot up.
                slot.restarts = self.max_restarts
                self._mark_dead(slot, slot.actor)

    def wait_ready(self, timeout: float = 600.0) -> None:
        """Waits until no replica is starting (each is live or given up), or
        ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        while True:
            starting = {s.ready_ref: s for s in self.slots if s.state == "starting"}
            if not starting:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                self._check_start_deadlines()
                return
            ready, _ = ray.wait(list(starting), num_returns=1, timeout=min(left, 1.0))
            for ref in ready:
                self._became_ready(starting[ref])
            self._check_start_deadlines()

    def _live(self) -> List[ReplicaSlot]:
        return [s for s in self.slots if s.state == "live"]

    @property
    def replicas(self) -> List[Any]:
        """The actor handles of the live replicas, in slot order."""
        return [s.actor for s in self._live()]

    @property
    def outstanding(self) -> List[int]:
        """Prompts in flight on each slot's replica (0 for a slot not live)."""
        return [s.outstanding if s.state == "live" else 0 for s in self.slots]

    def info(self) -> List[Dict[str, Any]]:
        """Each live replica's :meth:`RolloutReplica.info`."""
        return ray.get([a.info.remote() for a in self.replicas])

    # ----- weights -----

    def load_weights(self, path: Union[str, "os.PathLike[str]"]) -> int:
        """Serves ``path``'s weights (a checkpoint every node sees) on every replica
        as the next weight version, and returns it. Replicas starting meanwhile load
        it before they get work; one that dies while loading is replaced."""
        self.wait_ready(self.start_timeout)
        path = os.path.abspath(os.fspath(path))
        version = self.weight_version + 1
        calls = [(s, s.actor, s.actor.load_weights.remote(path, version)) for s in self._live()]
        self.weights, self.weight_version = path, version
        for slot, actor, ref in calls:
            try:
                ray.get(ref)
            except REPLICA_LOST:
                self._mark_dead(slot, actor)
        self.wait_ready(self.start_timeout)
        if not self._live():
            raise PoolError("every replica of the pool died")
        return version

    def load_state_dict(self, state: Any, version: Optional[int] = None) -> int:
        """Serves a trainer's weights, ``state`` (HF parameter names to torch tensors
        or numpy arrays, as :meth:`treegrpo.Engine.load_state_dict` takes them), on
        every replica as ``version`` (above the pool's; default the next) and returns
        it. The state dict is put in Ray's object store once and every replica reads
        that one object; replicas starting later load it too. A bad state dict (an
        unknown or missing name, a wrong shape) raises the replicas' ``ValueError``
        and the pool serves on as before."""
        self.wait_ready(self.start_timeout)
        if version is None:
            version = self.weight_version + 1
        if version <= self.weight_version:
            raise ValueError(
                f"weight version {version} is not above the pool's {self.weight_version}"
            )
        ref = ray.put(state)
        calls = [(s, s.actor, s.actor.load_state_dict.remote(ref, version)) for s in self._live()]
        refused: Optional[BaseException] = None
        for slot, actor, call in calls:
            try:
                ray.get(call)
            except REPLICA_LOST:
                self._mark_dead(slot, actor)
            except RayTaskError as e:
                refused = refused or e.as_instanceof_cause()
        if refused is not None:
            # The same state dict fails alike on every replica (one model): none swapped.
            raise refused
        self.weights, self.weight_version = ref, version
        self.wait_ready(self.start_timeout)
        if not self._live():
            raise PoolError("every replica of the pool died")
        return version

    # ----- rollouts -----

    def rollout(
        self,
        env: Any,
        samples: Union[int, Sequence[Any]],
        progress: Optional[Callable[[Dict[str, Any]], None]] = None,
        **options: Any,
    ) -> treegrpo.RolloutResult:
        """:func:`treegrpo.rollout` of ``samples`` in ``env`` (same arguments after
        the engine, same result), spread over the replicas one prompt per call.

        ``max_concurrent_prompts`` is per replica. ``token_budget`` is checked
        between prompts (a single engine checks it between branches): once the
        finished prompts computed that many tokens no more prompts start.
        ``progress`` is called after each finished prompt with ``prompts_done``,
        ``prompts``, ``rollouts``, ``computed_tokens``, ``seconds``, ``replica``.
        ``summary["forests"][i]`` says which ``replica`` slot made prompt ``i`` (on
        which Ray ``node_id``), under
        which ``weight_version``, in how many ``attempts``, and its ``call_seconds``
        (its ``wall_seconds`` on the replica plus what Ray adds); ``summary["pool"]``
        counts replicas, deaths and re-runs.
        """
        unknown = set(options) - ROLLOUT_OPTIONS
        if unknown:
            raise TypeError(f"unknown rollout options: {', '.join(sorted(unknown))}")
        prompt_samples = _per_prompt(env, samples)
        n = len(prompt_samples)
        if n == 0:
            raise ValueError("samples is empty")
        budget = options.pop("token_budget", None)
        per_replica = min(options.pop("max_concurrent_prompts", 16) or n, MAX_PROMPTS_PER_REPLICA)
        t0 = time.monotonic()
        env_ref = ray.put(env)
        pending: Deque[int] = deque(range(n))
        attempts = [0] * n
        finished: Dict[int, PromptResult] = {}
        # Each call in flight: its prompt, slot, actor, the actor's node and when it
        # was sent.
        in_flight: Dict[Any, Tuple[int, ReplicaSlot, Any, Optional[str], float]] = {}
        computed = 0
        rollouts = 0
        reruns = 0
        budget_spent = False
        deaths_before = self.deaths
        try:
            while pending or in_flight:
                budget_spent = budget_spent or (budget is not None and computed >= budget)
                while pending and not budget_spent:
                    slot = self._least_outstanding(per_replica)
                    if slot is None:
                        break
                    i = pending.popleft()
                    attempts[i] += 1
                    ref = slot.actor.rollout.remote(
                        env_ref, prompt_samples[i], prompt_offset=i, **options
                    )
                    in_flight[ref] = (
                        i, slot, slot.actor, slot.info.get("node_id"), time.monotonic()
                    )
                    slot.outstanding += 1
                if budget_spent:
                    pending.clear()
                starting = {s.ready_ref: s for s in self.slots if s.state == "starting"}
                if not in_flight and not starting:
                    if pending:
                        raise PoolError(
                            f"every replica of the pool died; {len(pending)} of {n} "
                            "prompts not rolled out (the others are in .partial)",
                            self._merge(n, finished, t0, deaths_before, reruns, budget, budget_spent),
                        )
                    break
                ready, _ = ray.wait(
                    list(in_flight) + list(starting), num_returns=1, timeout=1.0
                )
                for ref in ready:
                    if ref in starting:
                        self._became_ready(starting[ref])
                        continue
                    i, slot, actor, node_id, sent = in_flight.pop(ref)
                    if slot.actor is actor:
                        slot.outstanding -= 1
                    try:
                        result = ray.get(ref)
                    except REPLICA_LOST:
                        # The replica (or its node) died with this prompt: run it
                        # again elsewhere.
                        self._mark_dead(slot, actor)
                        pending.appendleft(i)
                        reruns += 1
                        continue
                    finished[i] = PromptResult(
                        result,
                        slot.index,
                        attempts[i],
                        time.monotonic() - sent,
                        node_id,
                    )
                    computed += result.summary["tokens"]["computed"]
                    rollouts += len(result.trajectories)
                    if progress is not None:
                        _report(
                            progress,
                            {
                                "prompts_done": len(finished),
                                "prompts": n,
                                "rollouts": rollouts,
                                "computed_tokens": computed,
                                "seconds": time.monotonic() - t0,
                                "replica": slot.index,
                            },
                        )
                self._check_start_deadlines()
        except BaseException:
            # An error of the run (a bad option, Ctrl-C): stop what is in flight.
            for ref in in_flight:
                try:
                    ray.cancel(ref)
                except Exception:
                    pass
            raise
        return self._merge(n, finished, t0, deaths_before, reruns, budget, budget_spent)

    def _merge(
        self,
        n: int,
        finished: Dict[int, PromptResult],
        t0: float,
        deaths_before: int,
        reruns: int,
        budget: Optional[int],
        budget_spent: bool,
    ) -> treegrpo.RolloutResult:
        return merge(
            n,
            finished,
            time.monotonic() - t0,
            self.weight_version,
            {
                "replicas": len(self.slots),
                "live_replicas": len(self._live()),
                "replica_deaths": self.deaths - deaths_before,
                "reruns": reruns,
            },
            token_budget=budget,
            budget_exhausted=budget_spent and len(finished) < n,
        )

    def _least_outstanding(self, cap: int) -> Optional[ReplicaSlot]:
        """The live replica with the fewest prompts in flight, under ``cap``."""
        open_slots = [s for s in self._live() if s.outstanding < cap]
        return min(open_slots, key=lambda s: s.outstanding, default=None)

    def generate(self, prompts: Any, **sampling: Any) -> List[Dict[str, Any]]:
        """:meth:`treegrpo.Engine.generate` on the least busy replica (each
        generation as its ``to_dict()``)."""
        slot = self._least_outstanding(cap=1 << 30)
        if slot is None:
            raise RuntimeError("no replica of the pool is live")
        return ray.get(slot.actor.generate.remote(prompts, **sampling))

    def shutdown(self) -> None:
        """Stops every replica."""
        for slot in self.slots:
            if slot.actor is not None:
                try:
                    ray.kill(slot.actor)
                except Exception:
                    pass
            slot.state = "dead"

    def __enter__(self) -> "RolloutPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _per_prompt(env: Any, samples: Union[int, Sequence[Any]]) -> List[Any]:
    """What one prompt's call passes as ``samples``: a built-in task's int N becomes
    N calls of ``1`` (with ``prompt_offset`` picking the task's sample), a list
    becomes its items, each in a list of one."""
    if isinstance(samples, bool):
        raise TypeError("samples must be an int or a list of samples")
    if isinstance(samples, int):
        if not isinstance(env, str):
            raise TypeError(
                "a Python environment's samples must be a list (there is no data set "
                "to count from)"
            )
        if samples < 0:
            raise ValueError("samples must be at least 1")
        return [1] * samples
    return [[s] for s in list(samples)]


def _report(progress: Callable[[Dict[str, Any]], None], event: Dict[str, Any]) -> None:
    """Calls the user's progress callback; its exceptions are printed, not raised
    (as with :func:`treegrpo.rollout`: they must not end the run)."""
    try:
        progress(event)
    except Exception:
        traceback.print_exc()


def _cause(error: BaseException) -> str:
    """The first line of what made an actor die, for an error message."""
    text = str(error).strip()
    for line in text.splitlines():
        if "Error" in line and "ActorDiedError" not in line:
            return line.strip()
    return text.splitlines()[0] if text else type(error).__name__
