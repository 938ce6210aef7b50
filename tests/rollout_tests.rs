//! Tree rollouts on the default model and the search-QA task: nothing is computed
//! twice, trees have the expected shape, and a seed fixes the output bytes.

mod common;
#[path = "rollout_tests/harness.rs"]
mod harness;

use std::sync::Arc;

use treegrpo::advantage::AdvantageMode;
use treegrpo::engine::{Engine, EngineConfig};
use treegrpo::env::{load_samples, EnvConfig, Environment, SearchQaEnv, DEFAULT_TOP_K};
use treegrpo::model::LoadedModel;
use treegrpo::rollout::export::TrajectoryRecord;
use treegrpo::rollout::{run_rollout, Output, RolloutResult, RunHooks, RunOptions, TreeConfig};

use harness::{data, jsonl, request, run, run_on, run_with, tree_config};

#[test]
fn tree_rollouts_compute_no_token_twice_and_have_one_plus_nl_leaves() {
    let model = Arc::new(LoadedModel::load(&common::default_model()).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let options = RunOptions::new(AdvantageMode::Tree);
    let (s, records, engine_computed) =
        run_with(&model, tree_config(true), 64, Some(dir.path()), options);
    assert_eq!(s.tokens.recomputed, 0);
    // Every leaf keeps its whole grade, not only the reward: the branching stats
    // compare siblings' answers through it.
    for r in &records {
        let score = r.trajectory.score.as_ref().expect("a tree leaf's score");
        assert_eq!(score.reward, r.trajectory.reward);
    }
    // Every token the engine computed is attributed to one forest or to the shared
    // prefix, and the per-forest figures add up to the totals.
    assert_eq!(s.tokens.computed, engine_computed);
    let forest_sum: u64 = s.forests.iter().map(|f| f.tokens.computed).sum();
    assert_eq!(forest_sum + s.shared_prefix.computed, engine_computed);
    assert_eq!(s.forests.len(), 2);
    for f in &s.forests {
        assert_eq!(f.rollouts, 6);
        assert_eq!(f.tokens.recomputed, 0);
        assert!(f.tokens.prompt_prefilled > 0 && f.tokens.decoded > 0);
    }
    // The prompt is prefilled once per prompt, not once per tree.
    let samples = load_samples(&data("train.jsonl")).unwrap();
    let env =
        SearchQaEnv::from_corpus_file(&data("corpus.jsonl"), DEFAULT_TOP_K, EnvConfig::default())
            .unwrap();
    let prompt_tokens: u64 = samples
        .iter()
        .take(2)
        .map(|q| {
            model
                .chat_prompt(env.start(q).unwrap().prompt())
                .unwrap()
                .len() as u64
        })
        .sum();
    // Each prompt's tokens are either computed once for its forest or found in the
    // prefix cache (the system prompt all prompts share is computed once for the run).
    let forest_prompt: u64 = s
        .forests
        .iter()
        .map(|f| f.tokens.prompt_prefilled + f.tokens.reused_prefix_cache)
        .sum();
    assert_eq!(forest_prompt, prompt_tokens);
    assert!(s.shared_prefix.prompt_prefilled > 0);
    for f in &s.forests {
        assert!(f.tokens.reused_prefix_cache >= s.shared_prefix.prompt_prefilled);
    }
    // Every tree: its first chain plus N·L branches, each ending in one leaf.
    let forest = std::fs::read_to_string(dir.path().join("forest.jsonl")).unwrap();
    let trees: Vec<serde_json::Value> = forest
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(trees.len(), 4);
    for t in &trees {
        let leaves = t["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["terminal"] == true)
            .inspect(|n| assert!(n["score"]["details"].is_object(), "{n}"))
            .count();
        let (n, l) = (2, 1);
        assert_eq!(leaves, 1 + n * l, "tree {}", t["tree_id"]);
    }
    assert_eq!(s.rollouts, 12);
    // The summary's throughput is its computed tokens over its wall time.
    let implied = s.computed_tokens_per_second * s.wall_seconds;
    assert!((implied - s.tokens.computed as f64).abs() <= 1e-6 * s.tokens.computed as f64 + 1e-6);
    let lines = std::fs::read_to_string(dir.path().join("trajectories.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 12);

    // The reference mode re-sends prefixes: same shape, many tokens recomputed.
    let r = run(&model, tree_config(false), 64, None);
    assert!(r.tokens.recomputed > 0);
    assert!(s.tokens_computed_per_rollout < r.tokens_computed_per_rollout);
}

#[test]
fn same_seed_same_bytes_whatever_the_batch_cap() {
    let model = Arc::new(LoadedModel::load(&common::default_model()).unwrap());
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    run(&model, tree_config(true), 64, Some(a.path()));
    // A smaller batch cap and one prompt at a time: different batches, same bytes.
    let one_at_a_time = RunOptions {
        max_concurrent_prompts: 1,
        ..RunOptions::new(AdvantageMode::Tree)
    };
    run_with(&model, tree_config(true), 3, Some(b.path()), one_at_a_time);
    let fa = std::fs::read(a.path().join("trajectories.jsonl")).unwrap();
    let fb = std::fs::read(b.path().join("trajectories.jsonl")).unwrap();
    assert!(!fa.is_empty());
    assert!(
        fa == fb,
        "trajectories.jsonl differs between batch caps 64 and 3"
    );
}

/// One prompt at a time: prompts start in prompt order, so each forest is on disk as
/// soon as it finishes (the files are written in prompt order). Before the fix, tasks
/// took their turns in whatever order they were first polled, and a first prompt that
/// ran last held every other forest back until the end of the run (so a rollout
/// interrupted early kept nothing on disk).
#[test]
fn one_prompt_at_a_time_writes_each_forest_as_it_finishes() {
    let model = Arc::new(LoadedModel::load(&common::default_model()).unwrap());
    let engine = Engine::start(model, EngineConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let options = RunOptions {
        max_concurrent_prompts: 1,
        ..RunOptions::new(AdvantageMode::Tree)
    };
    let mut cfg = tree_config(true);
    cfg.max_step_tokens = 8;
    let prompts = 6;
    let traj = dir.path().join("trajectories.jsonl");
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let progress = {
        let (traj, seen) = (traj.clone(), seen.clone());
        move |p: treegrpo::rollout::Progress| {
            // Prompts on disk when the `prompts_done`-th forest is reported.
            let text = std::fs::read_to_string(&traj).unwrap_or_default();
            let uids: std::collections::BTreeSet<String> = text
                .lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .map(|r| r["prompt_uid"].as_str().unwrap().to_string())
                .collect();
            seen.lock().unwrap().push((p.prompts_done, uids.len()));
        }
    };
    let hooks = RunHooks {
        output: Some(Output::create(dir.path()).unwrap()),
        progress: Some(Box::new(progress)),
        ..RunHooks::default()
    };
    let result = common::runtime()
        .block_on(run_rollout(engine, request(cfg, options, prompts), hooks))
        .unwrap();
    assert_eq!(result.summary.prompts_finished, prompts);
    let seen = seen.lock().unwrap().clone();
    let expected: Vec<(usize, usize)> = (1..=prompts).map(|k| (k, k)).collect();
    assert_eq!(seen, expected, "(forests finished, prompts on disk)");
}

/// A token budget stops new branches; the branches that do run are the same ones, with
/// the same tokens, as without a budget (a budget never changes a branch's seed).
#[test]
fn token_budget_stops_new_branches_and_keeps_the_rest_identical() {
    let model = Arc::new(LoadedModel::load(&common::default_model()).unwrap());
    // One prompt at a time, so the budget is checked between forests as well.
    let options = |budget| RunOptions {
        token_budget: budget,
        max_concurrent_prompts: 1,
        ..RunOptions::new(AdvantageMode::Tree)
    };
    let (full, full_records, _) = run_with(&model, tree_config(true), 64, None, options(None));
    assert!(!full.budget_exhausted);
    let budget = full.tokens.computed / 3;
    let (cut, cut_records, computed) =
        run_with(&model, tree_config(true), 64, None, options(Some(budget)));
    assert!(cut.budget_exhausted);
    assert_eq!(cut.token_budget, Some(budget));
    assert!(
        cut.rollouts < full.rollouts,
        "{} vs {}",
        cut.rollouts,
        full.rollouts
    );
    assert!(cut.forests.iter().map(|f| f.skipped_branches).sum::<u64>() > 0);
    assert!(computed < full.tokens.computed);
    let key = |r: &TrajectoryRecord| {
        (
            r.prompt_uid.clone(),
            r.tree_id,
            r.trajectory.response_ids.clone(),
        )
    };
    let full_keys: std::collections::HashSet<_> = full_records.iter().map(key).collect();
    for r in &cut_records {
        assert!(full_keys.contains(&key(r)), "a budgeted branch differs");
    }
}

/// Rows per KV block in the memory-pressure tests: smaller than the default so a pool
/// can be sized between the shortest and the longest trajectory.
const BLOCK: usize = 16;

/// The memory-pressure tests' engine: [`BLOCK`]-row blocks, `kv_budget_bytes` of KV.
fn pressure_engine(kv_budget_bytes: usize) -> EngineConfig {
    EngineConfig {
        block_size: BLOCK,
        kv_budget_bytes,
        ..EngineConfig::default()
    }
}

/// The KV budget that holds `blocks` blocks of [`BLOCK`] rows of the default model.
fn pool_bytes_for_blocks(model: &LoadedModel, blocks: usize) -> usize {
    blocks * BLOCK * model.model.config().kv_bytes_per_token()
}

/// Sequence length (prompt and every step) of each trajectory, shortest first.
fn sequence_lengths(records: &[TrajectoryRecord]) -> Vec<usize> {
    let mut lengths: Vec<usize> = records
        .iter()
        .map(|r| r.trajectory.prompt_ids.len() + r.trajectory.response_ids.len())
        .collect();
    lengths.sort();
    lengths
}

/// The memory-pressure tests' rollout (2 prompts, (2,2,1), 40-token steps: long
/// enough for trajectories of clearly different lengths), run once per test binary on
/// an unconstrained pool: what the constrained runs must match.
fn unconstrained() -> &'static (Arc<LoadedModel>, RolloutResult) {
    static FREE: std::sync::OnceLock<(Arc<LoadedModel>, RolloutResult)> =
        std::sync::OnceLock::new();
    FREE.get_or_init(|| {
        let model = Arc::new(LoadedModel::load(&common::default_model()).unwrap());
        let options = RunOptions::new(AdvantageMode::Tree);
        let (result, _) = run_on(
            &model,
            pressure_config(),
            pressure_engine(EngineConfig::default().kv_budget_bytes),
            None,
            options,
            2,
        );
        assert_eq!(result.summary.tokens.preemptions, 0);
        assert_eq!(result.summary.tokens.recomputed_preempted, 0);
        (model, result)
    })
}

fn pressure_config() -> TreeConfig {
    tree_config(true)
}

/// Memory pressure (issue 12): the same rollout on a KV pool an eighth of what it
/// peaks at unconstrained (or just over one branch, if that is more) preempts and
/// recomputes, and writes byte-identical trajectories and trees. Preemptions and the
/// tokens they recomputed are in the summary, and every computed token is still
/// attributed to exactly one forest.
#[test]
fn a_pool_an_eighth_of_the_peak_preempts_and_writes_the_same_bytes() {
    let (model, free) = unconstrained();
    let bytes_per_block = pool_bytes_for_blocks(model, 1);
    let peak_blocks = free.summary.peak_kv_bytes as usize / bytes_per_block;
    // One branch alone must fit: its blocks plus one copied on write.
    let one_branch = sequence_lengths(&free.records)
        .last()
        .unwrap()
        .div_ceil(BLOCK)
        + 2;
    let blocks = (peak_blocks / 8).max(one_branch);
    assert!(
        blocks * 3 <= peak_blocks,
        "{blocks} blocks is not well under the peak of {peak_blocks}"
    );
    eprintln!("peak {peak_blocks} blocks unconstrained; constrained pool {blocks} blocks");
    let small = pressure_engine(pool_bytes_for_blocks(model, blocks));
    let dir = tempfile::tempdir().unwrap();
    let options = RunOptions::new(AdvantageMode::Tree);
    let (tight, engine_computed) = run_on(
        model,
        pressure_config(),
        small,
        Some(dir.path()),
        options,
        2,
    );
    let (trees, records) = jsonl(free);
    let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
    assert!(!records.is_empty());
    assert!(
        read("trajectories.jsonl") == records,
        "trajectories differ under pressure"
    );
    assert!(
        read("forest.jsonl") == trees,
        "trees differ under memory pressure"
    );
    let (t, f) = (&tight.summary, &free.summary);
    assert_eq!(t.failed_branches, 0);
    assert!(t.tokens.preemptions > 0, "{:?}", t.tokens);
    assert!(t.tokens.recomputed_preempted > 0, "{:?}", t.tokens);
    // The figures stay exact: forests and the shared prefix add up to the engine's
    // counters, recomputation included; decoding and observations are unchanged.
    assert_eq!(t.tokens.computed, engine_computed);
    let forest_sum: u64 = t.forests.iter().map(|f| f.tokens.computed).sum();
    assert_eq!(forest_sum + t.shared_prefix.computed, engine_computed);
    let preempted: u64 = t.forests.iter().map(|f| f.tokens.preemptions).sum();
    assert_eq!(
        preempted + t.shared_prefix.preemptions,
        t.tokens.preemptions
    );
    assert_eq!(t.tokens.decoded, f.tokens.decoded);
    assert_eq!(
        t.tokens.observation_prefilled,
        f.tokens.observation_prefilled
    );
    let summary: serde_json::Value = serde_json::from_str(&read("summary.json")).unwrap();
    assert_eq!(summary["tokens"]["preemptions"], t.tokens.preemptions);
    assert_eq!(
        summary["tokens"]["recomputed_preempted"],
        t.tokens.recomputed_preempted
    );
}

/// A branch whose sequence is longer than the whole pool fails with a clear error;
/// the run goes on, the other branches finish, and the failure is in the summary.
#[test]
fn a_branch_longer_than_the_pool_fails_alone_and_the_run_goes_on() {
    let (model, free) = unconstrained();
    let lengths = sequence_lengths(&free.records);
    // The largest pool the longest trajectory does not fit in (its last sampled token
    // needs no KV, hence the 2): as many of the others as possible still fit, so
    // some finish even when the short ones are branches of a root chain that fails.
    let longest = *lengths.last().unwrap();
    let blocks = (longest - 2) / BLOCK;
    assert!(
        lengths[0] <= blocks * BLOCK + 1,
        "the trajectories are too alike in length: {lengths:?}"
    );
    let small = pressure_engine(pool_bytes_for_blocks(model, blocks));
    let options = RunOptions::new(AdvantageMode::Tree);
    let (tight, _) = run_on(model, pressure_config(), small, None, options, 2);
    let t = &tight.summary;
    assert!(t.failed_branches > 0, "no branch failed");
    assert!(t.rollouts > 0, "no branch finished");
    assert!(t.rollouts < free.summary.rollouts);
    let failed: Vec<_> = t.forests.iter().flat_map(|f| &f.failed_branches).collect();
    assert_eq!(failed.len(), t.failed_branches);
    for f in failed {
        assert!(
            f.error.contains("KV blocks") && f.error.contains(&format!("pool has {blocks}")),
            "{}",
            f.error
        );
        assert!(f.error.contains("--kv-mib"), "{}", f.error);
    }
    for len in sequence_lengths(&tight.records) {
        // A trajectory's last sampled token is never fed back, so it needs no KV.
        assert!(
            len <= blocks * BLOCK + 1,
            "a finished trajectory of {len} tokens"
        );
    }
}

/// The update's packing on a real (2,2,1) forest of the default model: the trie has
/// exactly one row per distinct token prefix of the trajectories (counted here from
/// scratch), and the forwarded-token ratio is printed.
#[test]
fn a_real_forest_packs_into_one_row_per_distinct_prefix() {
    let (_, free) = unconstrained();
    let seqs: Vec<(Vec<u32>, Vec<bool>)> = free
        .records
        .iter()
        .map(|r| {
            let mut t = r.trajectory.prompt_ids.clone();
            t.extend(&r.trajectory.response_ids);
            let wanted = vec![true; t.len()];
            (t, wanted)
        })
        .collect();
    let inputs: Vec<(&[u32], &[bool])> = seqs
        .iter()
        .map(|(t, w)| (t.as_slice(), w.as_slice()))
        .collect();
    let packed = treegrpo::train::pack::pack(&inputs, true, usize::MAX);
    let rows: usize = packed.iter().map(|p| p.batch.tokens.len()).sum();
    let distinct: std::collections::HashSet<&[u32]> = seqs
        .iter()
        .flat_map(|(t, _)| (1..=t.len()).map(move |n| &t[..n]))
        .collect();
    let unpacked: usize = seqs.iter().map(|(t, _)| t.len()).sum();
    eprintln!(
        "(2,2,1) forest of {} trajectories: {rows} rows packed, {unpacked} unpacked ({:.2}x fewer)",
        seqs.len(),
        unpacked as f64 / rows as f64
    );
    assert_eq!(rows, distinct.len());
    assert!(rows < unpacked);
}

/// Each tree's root chain (round 0's, grown first: node ids 1, 2, … along its path)
/// by (prompt, tree): its response tokens and both logprobs.
type RootChain = (String, usize, Vec<u32>, Vec<f32>, Vec<f32>);

fn root_chains(records: &[TrajectoryRecord]) -> Vec<RootChain> {
    records
        .iter()
        .filter(|r| r.node_path.iter().enumerate().all(|(i, n)| n.index() == i))
        .map(|r| {
            let t = &r.trajectory;
            (
                r.prompt_uid.clone(),
                r.tree_id,
                t.response_ids.clone(),
                t.response_logprobs.clone(),
                t.behaviour_logprobs().to_vec(),
            )
        })
        .collect()
}

#[test]
fn branch_sampling_boosts_branches_only_and_records_what_it_drew_from() {
    let model = Arc::new(LoadedModel::load(&common::default_model()).unwrap());
    let options = || RunOptions::new(AdvantageMode::Tree);
    let (_, plain, _) = run_with(&model, tree_config(true), 64, None, options());
    let mut boosted_cfg = tree_config(true);
    // The first 4 tokens of every branch at T = 3 from the 8 most likely.
    boosted_cfg.branch_sampling = Some("t3k8n4".parse().unwrap());
    let (_, boosted, _) = run_with(&model, boosted_cfg, 64, None, options());
    // Root chains never see the option: the same trajectories, logprobs and all.
    let roots = root_chains(&plain);
    assert_eq!(roots.len(), 4, "2 prompts × 2 trees");
    assert_eq!(root_chains(&boosted), roots);
    for r in &plain {
        let t = &r.trajectory;
        assert!(!t.response_boosted.contains(&1));
        assert_eq!(t.behaviour_logprobs(), t.response_logprobs.as_slice());
    }
    let (mut branches, mut off_policy) = (0, 0);
    for r in &boosted {
        let t = &r.trajectory;
        assert_eq!(t.response_behaviour_logprobs.len(), t.response_ids.len());
        let is_root = r.node_path.iter().enumerate().all(|(i, n)| n.index() == i);
        let flagged = (0..t.response_ids.len())
            .filter(|&j| t.is_boosted(j))
            .count();
        if is_root {
            assert_eq!(flagged, 0);
            continue;
        }
        // One boosted span of at most 4 tokens (fewer when the first step is
        // shorter), at the start of the branch's first step; every other model
        // token is the policy's own draw (T = 1, no cut).
        assert!(flagged <= 4, "{flagged} boosted tokens");
        branches += usize::from(flagged > 0);
        for j in 0..t.response_ids.len() {
            if t.response_mask[j] == 1 && !t.is_boosted(j) {
                assert_eq!(
                    t.response_behaviour_logprobs[j], t.response_logprobs[j],
                    "an unboosted token's behaviour is the policy"
                );
            } else if t.is_boosted(j) {
                assert_eq!(t.response_mask[j], 1);
                off_policy +=
                    usize::from(t.response_behaviour_logprobs[j] != t.response_logprobs[j]);
                assert!(t.response_behaviour_logprobs[j] <= 0.0);
            }
        }
    }
    assert!(branches >= 4, "{branches} boosted branch leaves");
    assert!(
        off_policy > 0,
        "boosted tokens record the boost's distribution"
    );
}
