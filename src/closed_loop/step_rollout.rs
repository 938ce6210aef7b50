//! A training step's rollouts: the step's prompts, grown once — or, under a
//! computed-token budget, in waves that add trees (chains) to the same prompts until
//! the budget is spent, so a search that costs less per tree spends its savings on
//! more rollouts of the same prompts (how Tree-GRPO compares trees with chains).
//!
//! Every decision is a function of token counts the waves already computed, which the
//! run's seeds fix; so a budgeted step is as reproducible as a plain one, and a resumed
//! run repeats it exactly.
//!
//! The planner: wave 1 grows one tree on every prompt (the configured M without a
//! budget: then there is only wave 1). After
//! each wave the cost of one tree is estimated as computed tokens / trees grown, and
//! the budget left buys `round(left / cost)` more trees: all prompts get
//! `trees / prompts` more each if that is at least one, else the first `trees`
//! prompts get one more. It stops when the budget buys no whole tree, or after
//! [`MAX_WAVES`].
//!
//! Whole trees overrun or fall short of a step's budget by up to half a tree, so the
//! budget is kept over the run, not per step: step `k` may spend what keeps the
//! run's cumulative computed tokens at `k × budget` ([`step_allowance`]). A step that
//! overran leaves the next that much less, and a run's total stays within about half
//! a tree of `steps × budget` however wide its trees (a (2,4,1) tree costs ~2k tokens,
//! an eighth of a 16k step: per step it overran by up to 5%).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use super::error::LoopError;
use crate::advantage::{group_advantages, AdvantageMode, AdvantageSignal, RewardGroup};
use crate::engine::{Engine, SeqRng};
use crate::env::{Environment, QaSample};
use crate::rollout::export::TrajectoryRecord;
use crate::rollout::{
    run_rollout, BranchingStats, RolloutRequest, RolloutResult, RunHooks, RunOptions, Tree,
    TreeConfig,
};

/// Most waves a budgeted step runs (the planner converges in two or three).
pub const MAX_WAVES: usize = 6;

/// What step `step` (from 1) may spend under a per-step `budget` when the steps
/// before it spent `spent`: what brings the run to `step × budget` (0 when they
/// overspent it; the step still grows its first wave).
pub fn step_allowance(budget: u64, step: u64, spent: u64) -> u64 {
    budget.saturating_mul(step).saturating_sub(spent)
}

/// What one wave grows: `trees` more trees on each of the first `prompts` prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wave {
    /// How many of the step's prompts (from the first) the wave grows.
    pub prompts: usize,
    /// Trees (chains) it adds to each.
    pub trees: usize,
}

/// The wave after waves that computed `computed` tokens growing `trees_grown` trees on
/// `prompts` prompts, under a step budget of `budget` tokens; `None` once the budget
/// left buys no whole tree.
pub fn next_wave(budget: u64, computed: u64, trees_grown: usize, prompts: usize) -> Option<Wave> {
    if prompts == 0 || trees_grown == 0 || computed >= budget {
        return None;
    }
    let per_tree = computed as f64 / trees_grown as f64;
    let trees = ((budget - computed) as f64 / per_tree.max(1.0)).round() as usize;
    match trees {
        0 => None,
        t if t >= prompts => Some(Wave {
            prompts,
            trees: t / prompts,
        }),
        t => Some(Wave {
            prompts: t,
            trees: 1,
        }),
    }
}

/// A step's rollouts, all waves together.
#[derive(Debug)]
pub struct StepRollouts {
    /// Every kept leaf, prompt by prompt, tree by tree (tree ids numbered across
    /// waves), with its advantage over its prompt's whole group.
    pub records: Vec<TrajectoryRecord>,
    /// The trees the records' leaves grew in, prompt by prompt, numbered as the
    /// records number them: what their steps did (actions, observations) is only here.
    pub trees: Vec<Tree>,
    /// Tokens computed, prefilled (prompt and observation), decoded and reused.
    pub computed: u64,
    /// Prompt and observation tokens computed.
    pub prefilled: u64,
    /// Tokens sampled.
    pub decoded: u64,
    /// Tokens needed but not computed (forks, prefix cache).
    pub reused: u64,
    /// The ids of the step's prompts, in order.
    pub prompt_ids: Vec<String>,
    /// Trees grown on each prompt, in prompt order.
    pub trees_per_prompt: Vec<usize>,
    /// Waves run (1 without a budget).
    pub waves: usize,
    /// The rollouts were stopped by the interrupt: nothing of the step is kept.
    pub interrupted: bool,
}

impl StepRollouts {
    /// Response tokens drawn from a branch sampling's wider distribution, summed
    /// over the leaves (a shared branch start counts once per leaf, as the update
    /// counts it).
    pub fn boosted_tokens(&self) -> usize {
        self.records
            .iter()
            .map(|r| {
                r.trajectory
                    .response_boosted
                    .iter()
                    .filter(|&&b| b == 1)
                    .count()
            })
            .sum()
    }

    /// Mean reward over the leaves (0 without any).
    pub fn mean_reward(&self) -> f64 {
        let n = self.records.len().max(1) as f64;
        self.records
            .iter()
            .map(|r| r.trajectory.reward)
            .sum::<f64>()
            / n
    }

    /// Where the trees' branches fork and how far apart they end (`None` for chains).
    pub fn branching(&self) -> Option<BranchingStats> {
        BranchingStats::of_trees(&self.records, &self.trees)
    }

    /// The learning signal of the leaves, grouped by prompt and tree.
    pub fn signal(&self) -> AdvantageSignal {
        let groups = prompt_groups(&self.records);
        let views: Vec<RewardGroup<'_>> = groups
            .iter()
            .map(|g| RewardGroup {
                rewards: &g.rewards,
                trees: &g.trees,
            })
            .collect();
        AdvantageSignal::of_groups(&views)
    }
}

/// One prompt's leaves among a step's records.
#[derive(Default)]
struct PromptGroup {
    /// Every leaf's reward, tree by tree.
    rewards: Vec<f64>,
    /// Where each tree's leaves sit in `rewards`.
    trees: Vec<Range<usize>>,
    /// The leaves' indices in the records.
    records: Vec<usize>,
}

/// The records' prompts in the order the records list them (prompt by prompt, tree
/// by tree).
fn prompt_groups(records: &[TrajectoryRecord]) -> Vec<PromptGroup> {
    let mut groups: Vec<PromptGroup> = Vec::new();
    let mut last: Option<(&str, usize)> = None;
    for (i, r) in records.iter().enumerate() {
        let key = (r.prompt_uid.as_str(), r.tree_id);
        if last.map(|l| l.0) != Some(key.0) {
            groups.push(PromptGroup::default());
        }
        let g = groups.last_mut().expect("a group was pushed");
        if last != Some(key) {
            let at = g.rewards.len();
            g.trees.push(at..at);
        }
        g.rewards.push(r.trajectory.reward);
        g.trees.last_mut().expect("a tree was pushed").end += 1;
        g.records.push(i);
        last = Some(key);
    }
    groups
}

/// Sets every record's advantage under `mode` over its prompt's whole group.
fn readvantage(records: &mut [TrajectoryRecord], mode: AdvantageMode) {
    for g in prompt_groups(records) {
        let advantages = group_advantages(&g.rewards, &g.trees, mode);
        for (i, a) in g.records.into_iter().zip(advantages) {
            records[i].advantage = a;
        }
    }
}

/// How a step's rollouts run.
pub struct StepRequest<'a> {
    /// The engine serving the policy.
    pub engine: &'a Engine,
    /// The task.
    pub env: &'a Arc<dyn Environment>,
    /// The step's prompts.
    pub samples: Vec<QaSample>,
    /// The search (its seed is the step's).
    pub tree: TreeConfig,
    /// The advantage mode.
    pub advantage: AdvantageMode,
    /// Most prompts grown at once (0: all).
    pub concurrent_prompts: usize,
    /// Computed tokens the step's rollouts may spend (`None`: one wave); a run gives
    /// its [`step_allowance`].
    pub budget: Option<u64>,
}

/// What each wave is given to report progress and to stop early.
pub type WaveHooks<'a> = dyn FnMut(WaveStart) -> RunHooks + Send + 'a;

/// A wave about to run, for its progress display.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaveStart {
    /// 1 for the step's first wave.
    pub wave: usize,
    /// Prompts it grows trees for.
    pub prompts: usize,
}

/// Runs the step's rollouts (see the module doc); `hooks` is called as each wave
/// starts and gives its progress callback and interrupt.
pub async fn step_rollouts(
    req: StepRequest<'_>,
    hooks: &mut WaveHooks<'_>,
) -> Result<StepRollouts, LoopError> {
    let n = req.samples.len();
    let mut gathered = GatheredWaves::new(&req.samples);
    if req.budget.is_some() {
        // What a budgeted step computes decides its waves: it starts from an empty
        // prefix cache, so that does not depend on what ran before it (an evaluation
        // whose prompts share the system prompt, or none after a resume).
        req.engine.clear_prefix_cache().await?;
    }
    let mut wave = Some(first_wave(&req));
    while let Some(w) = wave {
        let result = run_wave(&req, w, gathered.out.waves, hooks).await?;
        gathered.out.waves += 1;
        if result.summary.interrupted {
            gathered.out.interrupted = true;
            return Ok(gathered.out);
        }
        gathered.add(result, w);
        let grown: usize = gathered.out.trees_per_prompt.iter().sum();
        wave = match req.budget {
            Some(budget) if gathered.out.waves < MAX_WAVES => {
                next_wave(budget, gathered.out.computed, grown, n)
            }
            _ => None,
        };
    }
    Ok(gathered.finish(req.advantage))
}

/// The step's first wave, on every prompt. Under a budget it is one tree a prompt:
/// the budget, not the configured M, decides how many each prompt gets, and a wide
/// shape cannot overspend it in its first wave.
fn first_wave(req: &StepRequest<'_>) -> Wave {
    let first = if req.budget.is_some() {
        1
    } else {
        req.tree.shape.trees
    };
    Wave {
        prompts: req.samples.len(),
        trees: first,
    }
}

/// Runs wave `w` after `waves_before` waves: `w.trees` trees on each of the first
/// `w.prompts` prompts, with the hooks `hooks` gives it.
async fn run_wave(
    req: &StepRequest<'_>,
    w: Wave,
    waves_before: usize,
    hooks: &mut WaveHooks<'_>,
) -> Result<RolloutResult, LoopError> {
    let mut tree = req.tree.clone();
    tree.shape.trees = w.trees;
    if waves_before > 0 {
        // A stream of its own per wave: wave 1 keeps the step's seed.
        tree.seed =
            SeqRng::from_parts(&[req.tree.seed, waves_before as u64, 0x7761_7665]).next_u64();
    }
    let request = RolloutRequest {
        env: req.env.clone(),
        samples: req.samples[..w.prompts].to_vec(),
        config: tree,
        options: RunOptions {
            advantage: req.advantage,
            token_budget: None,
            max_concurrent_prompts: req.concurrent_prompts,
            prompt_offset: 0,
        },
    };
    let result = run_rollout(
        req.engine.clone(),
        request,
        hooks(WaveStart {
            wave: waves_before + 1,
            prompts: w.prompts,
        }),
    )
    .await?;
    Ok(result)
}

/// The waves' results gathered so far, per prompt so that a prompt's trees from every
/// wave end up together, in prompt order.
struct GatheredWaves {
    /// Where each prompt (by id) sits among the step's prompts.
    index: HashMap<String, usize>,
    /// Each prompt's records, wave after wave.
    records: Vec<Vec<TrajectoryRecord>>,
    /// Each prompt's trees, wave after wave.
    trees: Vec<Vec<Tree>>,
    /// The step's figures so far; its records and trees are filled in by
    /// [`Self::finish`].
    out: StepRollouts,
}

impl GatheredWaves {
    /// Nothing gathered yet for `samples`, the step's prompts.
    fn new(samples: &[QaSample]) -> Self {
        let n = samples.len();
        GatheredWaves {
            index: samples
                .iter()
                .enumerate()
                .map(|(i, s)| (s.id.to_string(), i))
                .collect(),
            records: vec![Vec::new(); n],
            trees: vec![Vec::new(); n],
            out: StepRollouts {
                records: Vec::new(),
                trees: Vec::new(),
                computed: 0,
                prefilled: 0,
                decoded: 0,
                reused: 0,
                prompt_ids: samples.iter().map(|s| s.id.to_string()).collect(),
                trees_per_prompt: vec![0; n],
                waves: 0,
                interrupted: false,
            },
        }
    }

    /// Adds wave `w`'s finished result: its tokens to the step's, and its records and
    /// trees to their prompts', tree ids numbered on from the prompt's earlier waves.
    fn add(&mut self, result: RolloutResult, w: Wave) {
        let out = &mut self.out;
        let t = &result.summary.tokens;
        out.computed += t.computed;
        out.prefilled += t.prompt_prefilled + t.observation_prefilled;
        out.decoded += t.decoded;
        out.reused += t.reused;
        for mut r in result.records {
            let Some(&p) = self.index.get(&r.prompt_uid) else {
                continue;
            };
            r.tree_id += out.trees_per_prompt[p];
            self.records[p].push(r);
        }
        for mut t in result.trees {
            let Some(&p) = self.index.get(&t.prompt_uid) else {
                continue;
            };
            t.tree_id += out.trees_per_prompt[p];
            self.trees[p].push(t);
        }
        for count in &mut out.trees_per_prompt[..w.prompts] {
            *count += w.trees;
        }
    }

    /// The step's rollouts, prompt by prompt; after several waves every advantage is
    /// recomputed under `advantage` over its prompt's whole group.
    fn finish(self, advantage: AdvantageMode) -> StepRollouts {
        let mut out = self.out;
        out.records = self.records.into_iter().flatten().collect();
        out.trees = self.trees.into_iter().flatten().collect();
        if out.waves > 1 {
            readvantage(&mut out.records, advantage);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planner_spends_what_is_left_in_whole_trees() {
        // 8 prompts × 2 trees cost 16 000: 1 000 a tree; 10 000 left buys 10 trees.
        assert_eq!(
            next_wave(26_000, 16_000, 16, 8),
            Some(Wave {
                prompts: 8,
                trees: 1
            })
        );
        // 3 000 left buys 3: the first three prompts get one more.
        assert_eq!(
            next_wave(27_000, 24_000, 24, 8),
            Some(Wave {
                prompts: 3,
                trees: 1
            })
        );
        // 24 000 left buys 24: three more each.
        assert_eq!(
            next_wave(40_000, 16_000, 16, 8),
            Some(Wave {
                prompts: 8,
                trees: 3
            })
        );
        // Less than half a tree left, or overspent: done.
        assert_eq!(next_wave(26_400, 26_000, 26, 8), None);
        assert_eq!(next_wave(20_000, 26_000, 26, 8), None);
    }

    #[test]
    fn allowance_carries_a_steps_overrun_to_the_next() {
        assert_eq!(step_allowance(16_000, 1, 0), 16_000);
        // Step 1 overran by 900: step 2 may spend 900 less.
        assert_eq!(step_allowance(16_000, 2, 16_900), 15_100);
        // It fell short by 700: step 3 may spend 700 more.
        assert_eq!(step_allowance(16_000, 3, 31_300), 16_700);
        // Overspent beyond the next step's share: nothing (wave 1 still runs).
        assert_eq!(step_allowance(16_000, 2, 33_000), 0);
    }
}
