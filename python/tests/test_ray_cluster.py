"""treegrpo.ray across nodes: a Ray cluster of three nodes on this machine (each node
its own raylet and object store, on loopback only), started and shut down by this
module. The pool's replicas land on three different nodes; a node removed in the
middle of a rollout takes its replica with it, the prompts that replica had are re-run
on the other nodes, and the trajectories are still those of one engine in-process; a
replica pinned to a node that is gone fails the pool with Ray's reason."""

import os

import pytest

import treegrpo

try:
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError:
    if os.environ.get("TREEGRPO_REQUIRE_PYTHON_PACKAGE"):
        raise
    pytest.skip("ray is not installed (pip install 'treegrpo[ray]')", allow_module_level=True)

from treegrpo.ray import PoolError, RolloutPool

from conftest import TEST_MODEL

SHAPE = dict(trees=2, expand=2, rounds=1, max_turns=1, max_step_tokens=16, seed=3)
PROMPTS = 9
ENGINE = dict(kv_mib=256, seed=0, model=TEST_MODEL)
# Loopback only: nothing listens beyond this machine. 127.0.0.2, not 127.0.0.1: Ray
# turns a cluster address on 127.0.0.1 into the machine's network address before it
# connects (the nodes listen on loopback only, so it would wait forever); 127.0.0.2 is
# loopback too, and taken as it is. Two logical CPUs a node: one for its replica, one
# for a replacement after another node is lost.
LOOPBACK = "127.0.0.2"
NODE = dict(num_cpus=2, node_ip_address=LOOPBACK, object_store_memory=128 * 1024 * 1024)


@pytest.fixture(scope="module")
def cluster():
    """A head node (it holds the driver and the cluster's control store, so it is
    never removed) and two worker nodes."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    cluster = Cluster(initialize_head=True, head_node_args=dict(NODE, include_dashboard=False))
    try:
        workers = [cluster.add_node(**NODE) for _ in range(2)]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, _node_ip_address=LOOPBACK, log_to_driver=False)
        yield cluster, workers
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def one_engine_result():
    """The reference: the same rollout on one engine in this process."""
    return treegrpo.rollout(treegrpo.Engine(**ENGINE), "calc", PROMPTS, **SHAPE)


def alive_nodes():
    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


def test_replicas_spread_over_nodes_and_a_lost_nodes_prompts_are_rerun_elsewhere(
    cluster, one_engine_result
):
    cluster, workers = cluster
    worker_by_id = {w.node_id: w for w in workers}
    with RolloutPool(3, threads=1, start_timeout=180, **ENGINE) as pool:
        nodes = [i["node_id"] for i in pool.info()]
        assert len(set(nodes)) == 3, f"replicas share a node: {nodes}"
        assert set(nodes) == alive_nodes()

        removed = []

        def remove_a_busy_worker_node(progress):
            # Once a prompt is done: the busiest replica on a worker node goes, node
            # and all, with prompts still in flight on it.
            if removed:
                return
            busy = [
                s
                for s in pool.slots
                if s.state == "live" and s.outstanding > 0 and s.info["node_id"] in worker_by_id
            ]
            if not busy:
                return
            victim = max(busy, key=lambda s: s.outstanding)
            removed.append((victim.info["node_id"], victim.outstanding))
            cluster.remove_node(worker_by_id[victim.info["node_id"]])

        out = pool.rollout(
            "calc", PROMPTS, progress=remove_a_busy_worker_node, max_concurrent_prompts=2, **SHAPE
        )
        assert removed, "no worker node had prompts in flight to lose"
        [(lost_node, lost_prompts)] = removed
        assert lost_node not in alive_nodes()

        # Seeds derive from the prompt: the re-run prompts give the trees they gave
        # anywhere, and the run is one engine's.
        assert out.trajectories == one_engine_result.trajectories
        assert out.forests == one_engine_result.forests
        forests = out.summary["forests"]
        assert [f["prompt_index"] for f in forests] == list(range(PROMPTS)), "each prompt once"
        assert out.summary["pool"]["replica_deaths"] == 1
        # The prompts in flight on the lost replica (those that had not already
        # answered, and any sent before its loss was seen) ran again elsewhere.
        reruns = out.summary["pool"]["reruns"]
        assert reruns >= 1, f"{lost_prompts} prompts were in flight on the lost node"
        assert sum(f["attempts"] - 1 for f in forests) == reruns
        rerun = [f for f in forests if f["attempts"] > 1]
        assert all(f["node_id"] != lost_node and f["node_id"] in alive_nodes() for f in rerun)

        # The lost replica's slot is served again, from a node still in the cluster.
        pool.wait_ready(180)
        live = [i["node_id"] for i in pool.info()]
        assert len(live) == 3
        assert lost_node not in live and set(live) <= alive_nodes()
        [g] = pool.generate(["2 + 2 ="], max_tokens=2)
        assert len(g["token_ids"]) >= 1


def test_a_replica_pinned_to_a_lost_node_fails_the_pool_with_its_cause(cluster):
    cluster, _ = cluster
    node = cluster.add_node(**NODE)
    cluster.remove_node(node)
    pinned = NodeAffinitySchedulingStrategy(node.node_id, soft=False)
    with pytest.raises(PoolError, match="no replica of the pool started: .*not schedulable"):
        RolloutPool(1, threads=1, start_timeout=60, actor_options={"scheduling_strategy": pinned}, **ENGINE)
