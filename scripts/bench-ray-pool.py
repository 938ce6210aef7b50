#!/usr/bin/env python3
"""Rollouts per second of treegrpo.ray's RolloutPool on this machine: 2 replicas x 1
thread against 1 replica x 2 threads, and against one engine in this process (2
threads), on the default model; and what Ray adds per prompt and per call.

Run with the Python package installed with its `ray` extra, on an otherwise idle
machine (docs/python-and-ray.md, "Scale-out on Ray"):

    python scripts/bench-ray-pool.py --prompts 8 --json /tmp/ray-pool.json

Every run rolls out the same prompts with the same seed; the script checks that all
three gave the same trajectories before it prints their times.
"""

import argparse
import json
import os
import sys
import time

# This process's engine (the in-process baseline) gets 2 compute threads; the
# variables are read when the first engine starts.
os.environ.setdefault("TREEGRPO_THREADS", "2")
os.environ.setdefault("RAYON_NUM_THREADS", "2")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray  # noqa: E402

import treegrpo  # noqa: E402
from treegrpo.ray import RolloutPool  # noqa: E402


def timed(label, fn):
    t = time.monotonic()
    out = fn()
    seconds = time.monotonic() - t
    print(f"{label}: {seconds:.1f} s", file=sys.stderr)
    return out, seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="calc")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--trees", type=int, default=2)
    ap.add_argument("--expand", type=int, default=2)
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--max-step-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kv-mib", type=int, default=512)
    ap.add_argument("--calls", type=int, default=200, help="round trips timed for the per-call cost")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    shape = dict(
        trees=a.trees,
        expand=a.expand,
        rounds=1,
        max_turns=a.max_turns,
        max_step_tokens=a.max_step_tokens,
        seed=a.seed,
    )
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    runs = {}

    def pool_run(name, replicas, threads):
        with RolloutPool(replicas, threads=threads, kv_mib=a.kv_mib) as pool:
            pool.rollout(a.env, 1, **dict(shape, seed=a.seed + 1))  # warm-up
            out, seconds = timed(name, lambda: pool.rollout(a.env, a.prompts, **shape))
            if replicas == 1:
                actor = pool.replicas[0]
                t = time.monotonic()
                for _ in range(a.calls):
                    ray.get(actor.weight_version.remote())
                runs["ray_call_ms"] = (time.monotonic() - t) / a.calls * 1e3
        runs[name] = (out, seconds)

    pool_run("1 replica x 2 threads", 1, 2)
    pool_run("2 replicas x 1 thread", 2, 1)
    engine = treegrpo.Engine(kv_mib=a.kv_mib)
    treegrpo.rollout(engine, a.env, 1, **dict(shape, seed=a.seed + 1))  # warm-up
    runs["in-process, 2 threads"] = timed(
        "in-process, 2 threads", lambda: treegrpo.rollout(engine, a.env, a.prompts, **shape)
    )
    ray.shutdown()

    names = ["in-process, 2 threads", "1 replica x 2 threads", "2 replicas x 1 thread"]
    reference = runs[names[0]][0].trajectories
    for name in names[1:]:
        if runs[name][0].trajectories != reference:
            sys.exit(f"{name}: trajectories differ from the in-process run's")
    rollouts = len(reference)
    figures = {
        "prompts": a.prompts,
        "rollouts": rollouts,
        "shape": shape,
        "env": a.env,
        "ray_call_ms": runs["ray_call_ms"],
        "runs": {},
    }
    print(f"\n{a.prompts} prompts, {rollouts} rollouts, same trajectories in every run")
    print(f"{'run':<24} {'wall s':>8} {'rollouts/s':>11} {'computed tok/s':>15}")
    for name in names:
        out, seconds = runs[name]
        computed = out.summary["tokens"]["computed"]
        figures["runs"][name] = {
            "wall_seconds": seconds,
            "rollouts_per_second": rollouts / seconds,
            "computed_tokens": computed,
            "computed_tokens_per_second": computed / seconds,
        }
        print(f"{name:<24} {seconds:>8.1f} {rollouts / seconds:>11.3f} {computed / seconds:>15.0f}")
    # What Ray adds to each prompt: the driver's time from sending the call to having
    # the result, less the replica's own run of it (the same on any engine).
    added = [
        f["call_seconds"] - f["wall_seconds"]
        for name in names[1:]
        for f in runs[name][0].summary["forests"]
    ]
    figures["ray_seconds_per_prompt_mean"] = sum(added) / len(added)
    figures["ray_seconds_per_prompt_max"] = max(added)
    whole = (runs[names[1]][1] - runs[names[0]][1]) / a.prompts
    figures["pool_1x2_minus_in_process_seconds_per_prompt"] = whole
    print(f"Ray round trip (one actor call): {runs['ray_call_ms']:.2f} ms")
    print(
        f"Ray's part of a prompt's call (call time less the replica's run): mean "
        f"{figures['ray_seconds_per_prompt_mean'] * 1e3:.0f} ms, max "
        f"{figures['ray_seconds_per_prompt_max'] * 1e3:.0f} ms"
    )
    print(f"whole run, pool (1 x 2) minus in-process, per prompt: {whole * 1e3:.0f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
