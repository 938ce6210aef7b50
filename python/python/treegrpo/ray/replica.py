"""One rollout engine in a Ray actor: :class:`RolloutReplica`.

The actor holds a :class:`treegrpo.Engine` for its whole life and runs the Python
package's calls on it: ``rollout``, ``generate``, ``load_weights``,
``load_state_dict``. It is a *threaded*
actor, so several rollout calls (one prompt each, from :class:`RolloutPool`) run at
once on the one engine and are batched into the same forward passes, while the GIL
is released inside the engine.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Dict, List, Optional, Union

import ray

import treegrpo

# Environment variables that size the engine's compute threads (read once, when the
# process's first engine starts): `TREEGRPO_THREADS` for the forward's thread team,
# `RAYON_NUM_THREADS` for everything that runs on rayon.
THREAD_VARIABLES = ("TREEGRPO_THREADS", "RAYON_NUM_THREADS")


def thread_env(threads: int) -> Dict[str, str]:
    """The environment variables that give an engine ``threads`` compute threads."""
    return {name: str(threads) for name in THREAD_VARIABLES}


class RolloutReplica:
    """A rollout engine: a model, its forkable KV cache and its scheduler, in a Ray
    actor (use :meth:`RolloutPool` or ``ray.remote(RolloutReplica)``).

    ``model``: a .gguf file or an HF folder on storage this node sees (None: the
    default model, fetched on first use). ``threads``: the engine's compute threads
    (give the actor as many CPUs). ``engine_options``: :class:`treegrpo.Engine`'s
    (``kv_mib``, ``max_batch_seqs``, ``seed``).
    """

    def __init__(
        self,
        model: Union[None, str, "os.PathLike[str]"] = None,
        threads: int = 1,
        **engine_options: Any,
    ) -> None:
        if threads < 1:
            raise ValueError("threads must be at least 1")
        # The pool also sets these in the actor's runtime environment; setting them
        # here covers a replica made with plain `ray.remote(RolloutReplica)`. They take
        # effect only if no engine ran in this process before.
        for name, value in thread_env(threads).items():
            os.environ.setdefault(name, value)
        self.threads = threads
        self.engine = treegrpo.Engine(model, **engine_options)

    def info(self) -> Dict[str, Any]:
        """Where the replica runs and what it serves: ``pid``, ``host``, ``node_id``
        (the Ray node's id, hex), ``model_path``, ``threads``, ``weight_version``."""
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "model_path": self.engine.model_path,
            "threads": self.threads,
            "weight_version": self.engine.weight_version,
        }

    def rollout(self, env: Any, samples: Any, **options: Any) -> treegrpo.RolloutResult:
        """:func:`treegrpo.rollout` on this replica's engine (``progress`` is not
        forwarded: a callable cannot call back into the caller's process)."""
        options.pop("progress", None)
        return treegrpo.rollout(self.engine, env, samples, **options)

    def generate(self, prompts: Any, **sampling: Any) -> List[Dict[str, Any]]:
        """:meth:`treegrpo.Engine.generate`, each generation as its ``to_dict()``."""
        return [g.to_dict() for g in self.engine.generate(prompts, **sampling)]

    def load_weights(self, path: str, version: Optional[int] = None) -> int:
        """:meth:`treegrpo.Engine.load_weights`: serves ``path``'s weights as
        ``version`` (default: the next); returns the version now served."""
        return self.engine.load_weights(path, version)

    def load_state_dict(self, state: Any, version: Optional[int] = None) -> int:
        """:meth:`treegrpo.Engine.load_state_dict`: serves a state dict's weights as
        ``version`` (default: the next); returns the version now served."""
        return self.engine.load_state_dict(state, version)

    def weight_version(self) -> int:
        return self.engine.weight_version

    def stats(self) -> Dict[str, Any]:
        return self.engine.stats()

    def prepare(self, weights: Any, version: int) -> Dict[str, Any]:
        """Brings a new replica up to a pool's policy: loads ``weights`` (a
        checkpoint path, or a state dict) as ``version`` unless it already serves
        that version; returns :meth:`info`."""
        if weights is not None and self.engine.weight_version < version:
            if isinstance(weights, (str, os.PathLike)):
                self.engine.load_weights(weights, version)
            else:
                self.engine.load_state_dict(weights, version)
        return self.info()
