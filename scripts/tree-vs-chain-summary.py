"""Summarises a scripts/tree-vs-chain.sh folder: each run's eval rewards, tokens and
rollouts, then per arm the mean eval at the start, at the end, over the last three
evaluations, and at an equal budget (the last evaluation of each run within the
smallest run's total of computed tokens).

    python3 scripts/tree-vs-chain-summary.py OUT > OUT/summary.txt
"""
import json, glob, os, sys, statistics as st
out = sys.argv[1]
runs = {}
for d in sorted(glob.glob(f'{out}/*-seed*')):
    lines = [json.loads(l) for l in open(f'{d}/log.jsonl')]
    runs[os.path.basename(d)] = lines
def evals(lines): return [l['eval_reward'] for l in lines if l.get('eval_reward') is not None]
def at_budget(lines, budget):
    """eval reward of the last evaluated step whose cumulative computed tokens <= budget"""
    best = None
    for l in lines:
        if l.get('eval_reward') is not None and l['tokens']['cumulative_computed'] <= budget:
            best = l['eval_reward']
    return best
rows = []
for name, lines in runs.items():
    ev = evals(lines)
    last = lines[-1]
    rows.append((name, ev, last['tokens']['cumulative_computed'], sum(l['rollouts'] for l in lines),
                 [round(l['reward_mean'], 3) for l in lines[1:]],
                 sum(l['rollout_seconds'] for l in lines), sum(l['update_seconds'] for l in lines)))
    print(f"{name} eval {[round(e,3) for e in ev]} tokens {last['tokens']['cumulative_computed']} rollouts {rows[-1][3]} "
          f"train reward {rows[-1][4]} rollout s {rows[-1][5]:.0f} update s {rows[-1][6]:.0f}")
arms = {}
for name, ev, tok, ro, tr, rs, us in rows:
    arm = name.rsplit('-seed', 1)[0]
    arms.setdefault(arm, []).append((ev, tok, ro, tr))
budget = min(tok for _, _, tok, *_ in rows)
print(f"equal budget: {budget} computed tokens (the smallest run's total)")
for arm, rs in arms.items():
    start = st.mean(r[0][0] for r in rs); final = st.mean(r[0][-1] for r in rs)
    best = st.mean(max(r[0]) for r in rs)
    mean_last3 = st.mean(st.mean(r[0][-3:]) for r in rs)
    toks = st.mean(r[1] for r in rs); ro = st.mean(r[2] for r in rs)
    at_b = st.mean(at_budget(runs[f'{arm}-seed{i+1}'], budget) for i in range(len(rs)))
    trmean = st.mean(st.mean(r[3]) for r in rs)
    print(f"{arm} runs {len(rs)} mean eval start {start:.3f} final {final:.3f} mean of last 3 evals {mean_last3:.3f} "
          f"at equal budget {at_b:.3f} mean train reward {trmean:.3f} mean tokens {toks:.0f} rollouts/run {ro:.0f} "
          f"tokens/rollout {toks/ro:.1f}")
