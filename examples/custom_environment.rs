//! A custom environment written in Rust, run as Tree-GRPO rollouts, and the
//! advantages of its leaves.
//!
//! `cargo run --release --example custom_environment`
//!
//! The task is a guessing game. The environment thinks of a number between 1 and 100;
//! each step the model writes one sentence, whose first number is its guess, and the
//! environment answers "higher" or "lower" (an observation: in the context, never
//! trained on). An episode ends on the right number or after three guesses. The reward is 1 for the number, else up to
//! 0.5 the closer the last guess came, so even an untrained model's leaves differ.
//!
//! The rollouts are trees: M=2 trees per prompt, then L=1 round growing N=2 branches
//! in each, forked from a step of the tree (sharing its KV cache and a copy of its
//! episode state). The advantage module then turns each prompt's leaf rewards into
//! Tree-GRPO advantages (intra-tree + inter-tree). The default model is fetched on
//! first use, as in `embed_engine`.

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use treegrpo::advantage::{leaf_advantages, AdvantageMode, PromptForest};
use treegrpo::engine::{Engine, EngineConfig};
use treegrpo::env::{
    EnvConfig, EnvError, Environment, Episode, ExternalState, QaSample, RewardMetric, Score,
    ScoreDetails, StepOutcome,
};
use treegrpo::model::{fetch, ChatMessage, LoadedModel};
use treegrpo::rollout::{
    run_rollout, NodeId, RolloutRequest, RunHooks, RunOptions, Tree, TreeOptions,
};

const MAX_GUESSES: usize = 3;
const SYSTEM: &str = "We play a game. I think of a whole number between 1 and 100 and you \
guess it. Answer with one short sentence that names your guess, like: My guess is 50. After \
each guess I say whether my number is higher or lower. You have three guesses.";

/// The environment: shared by every rollout, so it keeps nothing per episode.
struct GuessEnv {
    config: EnvConfig,
}

/// What one episode remembers. A branch forked at a step continues from a copy.
#[derive(Debug, Clone)]
struct Game {
    secret: u32,
    last_guess: Option<u32>,
}

impl ExternalState for Game {
    fn fork(&self) -> Box<dyn ExternalState> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The step's guess: the first number in it, if it has one.
fn parse_guess(text: &str) -> Option<u32> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let digits = text[start..].split(|c: char| !c.is_ascii_digit()).next()?;
    digits.parse().ok()
}

fn game(episode: &Episode) -> Result<&Game, EnvError> {
    episode
        .external_state::<Game>()
        .ok_or_else(|| EnvError::EpisodeFailed("not a guessing-game episode".into()))
}

#[async_trait]
impl Environment for GuessEnv {
    fn name(&self) -> &str {
        "guess-the-number"
    }

    fn config(&self) -> &EnvConfig {
        &self.config
    }

    fn stop_strings(&self) -> Vec<String> {
        // A step is one sentence.
        vec![".".into()]
    }

    fn start(&self, sample: &QaSample) -> Result<Episode, EnvError> {
        let secret = sample.golden_answers.first().and_then(|a| a.parse().ok());
        let secret = secret
            .ok_or_else(|| EnvError::EpisodeFailed(format!("{}: no secret number", sample.id)))?;
        let prompt = vec![
            ChatMessage::new("system", SYSTEM),
            ChatMessage::new("user", sample.question.clone()),
        ];
        let state = Box::new(Game {
            secret,
            last_guess: None,
        });
        Ok(Episode::with_external_state(
            sample.clone(),
            prompt,
            MAX_GUESSES,
            state,
        ))
    }

    async fn step(&self, episode: &mut Episode, text: &str) -> Result<StepOutcome, EnvError> {
        let guess = parse_guess(text);
        let secret = game(episode)?.secret;
        let left = MAX_GUESSES.saturating_sub(episode.steps().len() + 1);
        let done = guess == Some(secret) || left == 0;
        let observation = (!done).then(|| match guess {
            None => " Please name one number.\n".to_string(),
            Some(g) if g < secret => format!(" Higher than {g}. {left} guesses left.\n"),
            Some(g) => format!(" Lower than {g}. {left} guesses left.\n"),
        });
        if let (Some(g), Some(state)) = (guess, episode.external_state_mut::<Game>()) {
            state.last_guess = Some(g);
        }
        Ok(StepOutcome::external(episode, text, observation, done))
    }

    fn score(&self, episode: &Episode) -> Score {
        let (secret, last) = game(episode).map_or((0, None), |g| (g.secret, g.last_guess));
        let found = last == Some(secret);
        let reward = match last {
            _ if found => 1.0,
            Some(g) => 0.5 * (1.0 - f64::from(g.abs_diff(secret)) / 100.0).max(0.0),
            None => 0.0,
        };
        let steps = episode.steps();
        let invalid = steps
            .iter()
            .filter(|s| parse_guess(&s.text).is_none())
            .count();
        let details = ScoreDetails {
            answer: last.map(|g| g.to_string()),
            exact_match: found,
            f1: reward,
            metric: RewardMetric::Environment,
            well_formed: invalid == 0,
            format_issue: None,
            steps: steps.len(),
            tool_calls: 0,
            tool_errors: 0,
            invalid_actions: invalid,
        };
        Score { reward, details }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let path = fetch::ensure_default_model(&mut |msg| eprintln!("{msg}"))?;
    let model = Arc::new(LoadedModel::load(&path)?);
    let config = EngineConfig {
        kv_budget_bytes: 256 << 20,
        ..EngineConfig::default()
    };
    let engine = Engine::start(model, config)?;

    let games = [
        ("odd", "odd", "37"),
        ("big", "above 50", "82"),
        ("small", "below 10", "5"),
    ];
    let samples = games.map(|(id, hint, secret)| {
        let question = format!("My number is {hint}. Your first guess?");
        QaSample::new(id, question, vec![secret.to_string()])
    });
    // The reference scripts' (M=2, N=2, L=1) trees at temperature 1, checked as the CLI,
    // the server and Python check theirs.
    let tree_config = TreeOptions {
        max_step_tokens: 24,
        seed: 7,
        ..TreeOptions::default()
    }
    .config()?;
    let request = RolloutRequest {
        env: Arc::new(GuessEnv {
            config: EnvConfig::default(),
        }),
        samples: samples.to_vec(),
        config: tree_config,
        options: RunOptions::new(AdvantageMode::Tree),
    };
    let result = run_rollout(engine, request, RunHooks::default()).await?;
    let tokens = &result.summary.tokens;
    println!(
        "{} leaves in {:.1} s; tokens computed {}, reused (forks and prefix cache) {}",
        result.summary.rollouts, result.summary.wall_seconds, tokens.computed, tokens.reused
    );

    // Each prompt's trees are one group: advantages compare a leaf with its own tree's
    // leaves (same prefix) and with the prompt's. (The rollout computed the same ones
    // for its records, `result.records`, under `RunOptions::advantage`.)
    for trees in result.trees.chunk_by(|a, b| a.prompt_uid == b.prompt_uid) {
        let forest = PromptForest::new(trees.iter().map(Tree::advantage_view).collect())?;
        let advantages = leaf_advantages(&forest, AdvantageMode::Tree);
        println!("\nprompt {}", trees[0].prompt_uid);
        for leaf in &advantages.leaves {
            let tree = &trees[leaf.tree];
            let path = tree.path(NodeId::new(leaf.node.0));
            let guesses: Vec<String> = path[1..]
                .iter()
                .map(|&n| parse_guess(&tree[n].text).map_or("-".into(), |g| g.to_string()))
                .collect();
            let path: Vec<String> = path.iter().map(NodeId::to_string).collect();
            println!(
                "  tree {} leaf {:>2}  path {:<10} guesses {:<12} reward {:.3}  advantage {:+.3}",
                leaf.tree,
                leaf.node,
                path.join("-"),
                guesses.join(","),
                leaf.reward,
                leaf.advantage
            );
        }
    }
    Ok(())
}
