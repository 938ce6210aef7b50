"""Branch diversity of `treegrpo rollout --out` folders: per folder, the share of a
tree's leaves equal to a sibling token for token, the mean reward of the root chains'
leaves (round 0) against the leaves grown from forks, and whether the root chains equal
the first folder's (branch sampling must not touch them). Usage:
    python3 scripts/branch_diversity.py runs/plain runs/treerl ...
"""
import json,sys
def stats(d):
    recs=[json.loads(l) for l in open(d+'/trajectories.jsonl')]
    by={}
    for r in recs: by.setdefault((r['prompt_uid'],r['tree_id']),[]).append(r)
    ident=0;n=0;root=[];fork=[];roots={}
    for k,ls in by.items():
        for r in ls:
            n+=1
            ident+=any(o is not r and o['response_ids']==r['response_ids'] for o in ls)
            isroot=all(x==i for i,x in enumerate(r['node_path']))
            (root if isroot else fork).append(r['reward'])
            if isroot: roots[k]=r['response_ids']
    m=lambda v: sum(v)/max(len(v),1)
    return dict(leaves=n,identical_leaf_share=ident/n,root_reward=m(root),fork_reward=m(fork),fork_over_root=m(fork)/max(m(root),1e-9),roots=roots)
base=None
for d in sys.argv[1:]:
    s=stats(d)
    roots=s.pop('roots')
    if base is None: base=roots
    s['root_chains_unchanged']=roots==base
    print(d, {k:(round(v,3) if isinstance(v,float) else v) for k,v in s.items()})
