"""Scale-out on Ray: rollout replicas as Ray actors (``pip install 'treegrpo[ray]'``).

- :class:`RolloutReplica` — a Ray actor holding a :class:`treegrpo.Engine`, with
  ``rollout``, ``generate`` and ``load_weights`` as remote methods.
- :class:`RolloutPool` — ``num_replicas`` replicas serving one policy:
  ``rollout(env, samples, **options)`` takes :func:`treegrpo.rollout`'s arguments
  after the engine and returns the same :class:`treegrpo.RolloutResult`, each
  prompt's forest grown on one replica; ``load_weights(path)`` reaches every replica
  before the next rollout; a replica that dies has its prompts re-run elsewhere and
  is replaced.

On a cluster: ``ray start --head`` on one node, ``ray start --address=HEAD:6379`` on
the others, then ``ray.init(address="auto")`` before making the pool; the model and
every checkpoint passed to ``load_weights`` must be on storage every node sees.
"""

try:
    import ray as _ray  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "treegrpo.ray needs Ray: pip install 'treegrpo[ray]' (or pip install ray)"
    ) from e

from .pool import PoolError, RolloutPool
from .replica import RolloutReplica

__all__ = ["PoolError", "RolloutPool", "RolloutReplica"]
