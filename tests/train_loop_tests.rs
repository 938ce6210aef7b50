//! The closed loop on the calc task, on the default model (SmolLM2-135M) where its
//! weights matter and on tiny models the tests write elsewhere (CI time):
//!
//! - the trainer's weights served by the engine: before any update they give
//!   bit-identically the engine's own (Q4 == its dequantised f32 copy); after a real
//!   update the engine's logprobs agree with the trainer's within the update's 1e-4
//!   nats (only summation order differs);
//! - (tiny model) a run stopped after a step and resumed from its checkpoint writes
//!   the same log as the uninterrupted run (timings aside), and every line of an interrupted log is
//!   whole; its KL is against the frozen start weights: 0 at the first step (policy and
//!   reference are one), above 0 once an update has moved the policy, the same after a
//!   resume (the reference is restored from the run folder, not the moved weights);
//! - learning (a random two-layer model of width 64 with the default model's
//!   vocabulary, written by the test: the "small model the test makes"): a
//!   warm-start on the oracle's demonstrations raises the greedy eval reward, Tree-GRPO
//!   steps raise it further, each by a stated margin, and the same run at learning
//!   rate 0 does not move it at all.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use candle_core::DType;
use common::tiny::{Flavour, TinyModel, Vocabulary};
use treegrpo::advantage::AdvantageMode;
use treegrpo::closed_loop::{
    evaluate, read_log, run_sft, sft_sample, warm_start, LoopConfig, LoopEvent, LoopOutcome,
    SftConfig, StepLog, StopSignal, TrainRun,
};
use treegrpo::engine::{Engine, EngineConfig, EngineCore, Sampling};
use treegrpo::env::{Environment, QaSample, Split, Task, TaskData};
use treegrpo::model::kernels::WeightFormat;
use treegrpo::model::LoadedModel;
use treegrpo::rollout::{demonstrations, Selection, TreeConfig, TreeShape};
use treegrpo::train::pack::pack;
use treegrpo::train::{KlReference, Optimizer, OptimizerConfig, Params, UpdateConfig};

fn model() -> Arc<LoadedModel> {
    Arc::new(LoadedModel::load(&common::default_model()).unwrap())
}

fn calc(turns: usize, n: usize) -> (Arc<dyn Environment>, Vec<QaSample>, Vec<QaSample>) {
    let data = TaskData::Embedded;
    let (env, train) = Task::Calc.setup(&data, turns, n).unwrap();
    let test = Task::Calc.split(&data, Split::Test, 50).unwrap();
    (env, train, test)
}

/// Engine logits at every position of `tokens` but the first (row `i`: the logits at
/// position `i`, predicting token `i + 1`; row 0 is left empty).
fn engine_logits(core: &mut EngineCore, tokens: &[u32]) -> Vec<Vec<f32>> {
    let seq = core.add_sequence(&tokens[..1]).unwrap();
    core.run_until_idle().unwrap();
    let mut rows = vec![Vec::new()];
    rows.extend(core.score(seq, &tokens[1..]).unwrap());
    core.free(seq).unwrap();
    rows
}

#[test]
fn served_trainer_weights_match_the_engine_before_and_the_trainer_after_an_update() {
    let m = model();
    let (env, train, _) = calc(2, 4);
    let demos = common::runtime()
        .block_on(demonstrations(&m, env.as_ref(), &train))
        .unwrap();
    let sample = sft_sample(&demos[0]);
    let params = Params::from_model(&m.model, DType::F32).unwrap();

    // Before any update: the served f32 copy is the Q4 model, bit for bit.
    let mut q4 = EngineCore::new(m.clone(), EngineConfig::default()).unwrap();
    let reference = engine_logits(&mut q4, &sample.tokens);
    q4.swap_weights(Arc::new(params.to_model(WeightFormat::F32).unwrap()))
        .unwrap();
    assert_eq!(engine_logits(&mut q4, &sample.tokens), reference);

    // A real update (lr 1e-4 SFT steps move the logits by far more than 1e-4).
    let mut opt = Optimizer::new(OptimizerConfig {
        lr: 1e-4,
        ..OptimizerConfig::default()
    });
    let cfg = SftConfig {
        epochs: 2,
        batch_size: 1,
        ..SftConfig::default()
    };
    run_sft(
        &params,
        &mut opt,
        std::slice::from_ref(&sample),
        &cfg,
        &mut |_| {},
    )
    .unwrap();
    let version = q4
        .swap_weights(Arc::new(params.to_model(WeightFormat::F32).unwrap()))
        .unwrap();
    assert_eq!(version, 2);
    let served = engine_logits(&mut q4, &sample.tokens);

    let wanted: Vec<bool> = (0..sample.tokens.len())
        .map(|i| i >= sample.prompt_len)
        .collect();
    let packed = &pack(&[(&sample.tokens, &wanted)], true, 1 << 20)[0];
    let trainer = params
        .score(&packed.batch, 1.0, false)
        .unwrap()
        .logp
        .to_vec1::<f32>()
        .unwrap();
    let (mut max_diff, mut max_moved) = (0f64, 0f64);
    for (k, pos) in (sample.prompt_len..sample.tokens.len()).enumerate() {
        let t = sample.tokens[pos];
        let ours = common::log_softmax_at(&served[pos - 1], t);
        max_diff = max_diff.max((ours - trainer[k] as f64).abs());
        max_moved = max_moved.max((ours - common::log_softmax_at(&reference[pos - 1], t)).abs());
    }
    eprintln!("served vs trainer max |Δ logp| {max_diff:.2e}; moved by the update {max_moved:.3}");
    assert!(max_diff < 1e-4, "served vs trainer: {max_diff}");
    assert!(max_moved > 1e-2, "the update changed the served policy");
}

/// A Tree-GRPO run on calc of `shape` at T = 1, `prompts` a step, `max_step_tokens`
/// steps, evaluation only before the first and after the last step.
fn loop_config(
    steps: u64,
    prompts: usize,
    shape: TreeShape,
    seed: u64,
    max_step_tokens: usize,
    eval_prompts: usize,
    checkpoint_every: u64,
) -> LoopConfig {
    let sampling = Sampling::Random {
        min_p: None,
        temperature: 1.0,
        top_k: None,
        top_p: None,
    };
    let mut tree = TreeConfig::new(shape, sampling, seed);
    tree.max_step_tokens = max_step_tokens;
    LoopConfig {
        step_budget: None,
        eval_every_tokens: 0,
        eval_before: true,
        boosted_tokens: Default::default(),
        steps,
        prompts_per_step: prompts,
        tree,
        advantage: AdvantageMode::Tree,
        concurrent_prompts: 0,
        update: UpdateConfig::default(),
        eval_every: 0,
        eval_prompts,
        checkpoint_every,
        serve_format: WeightFormat::F32,
        kl_reference: KlReference::Previous,
    }
}

/// A short run: one prompt per step, (1,2,1) trees, 16-token steps, a checkpoint each.
fn small_config(steps: u64) -> LoopConfig {
    loop_config(
        steps,
        1,
        TreeShape::tree(1, 2, 1, Selection::Paper),
        7,
        16,
        1,
        1,
    )
}

fn new_run(m: &Arc<LoadedModel>, config: LoopConfig, out: &Path, lr: f64) -> TrainRun {
    let (env, train, test) = calc(1, 8);
    let engine = Engine::start(m.clone(), EngineConfig::default()).unwrap();
    let params = Params::from_model(&m.model, DType::F32).unwrap();
    let optimizer = Optimizer::new(OptimizerConfig {
        lr,
        ..OptimizerConfig::default()
    });
    TrainRun::new(
        engine,
        m.clone(),
        env,
        train,
        test,
        params,
        optimizer,
        config,
        out.to_path_buf(),
    )
    .unwrap()
}

fn no_events() -> treegrpo::closed_loop::EventFn {
    Box::new(|_| {})
}

#[test]
fn a_run_stopped_after_a_step_and_resumed_writes_the_uninterrupted_log() {
    let dir = tempfile::tempdir().unwrap();
    let m = common::server::tiny(&dir.path().join("model"), 5);
    let rt = common::runtime();

    // A frozen KL reference: the run's start weights, kept in the run folder.
    let config = || LoopConfig {
        step_budget: None,
        eval_every_tokens: 0,
        eval_before: true,
        boosted_tokens: Default::default(),
        kl_reference: KlReference::Start,
        ..small_config(3)
    };
    let whole = dir.path().join("whole");
    let mut run = new_run(&m, config(), &whole, 1e-3);
    let outcome = rt
        .block_on(run.run(Arc::new(StopSignal::default()), no_events()))
        .unwrap();
    assert_eq!(outcome, LoopOutcome::Finished { steps: 3 });
    let expected: Vec<StepLog> = read_log(&whole.join("log.jsonl"))
        .unwrap()
        .iter()
        .map(StepLog::without_timings)
        .collect();
    assert_eq!(expected.len(), 4, "step 0 and three steps");
    assert_eq!(
        expected
            .iter()
            .map(|l| l.weight_version)
            .collect::<Vec<_>>(),
        vec![0, 0, 1, 2],
        "each step's rollouts come from the policy before it"
    );
    assert!(expected[1..]
        .iter()
        .all(|l| l.rollouts > 0 && l.tokens.computed > 0));
    assert!(whole.join("reference/model.safetensors").exists());
    // Step 1 samples and updates the start weights themselves: the reference forward
    // gives the update's own log-probabilities, so the KL vanishes; by step 3 two
    // updates have moved the policy away from the frozen copy.
    assert!(expected[1].kl.abs() < 1e-12, "step 1 KL {}", expected[1].kl);
    assert!(expected[3].kl > 0.0, "step 3 KL {}", expected[3].kl);

    // The same run, stopped once step 2 has started (as SIGINT would stop it).
    let cut = dir.path().join("cut");
    let mut run = new_run(&m, config(), &cut, 1e-3);
    let stop = Arc::new(StopSignal::default());
    let signal = stop.clone();
    let on_event = Box::new(move |e: LoopEvent<'_>| {
        if let LoopEvent::Rollout { step: 2, .. } = e {
            signal.raise();
        }
    });
    let outcome = rt.block_on(run.run(stop, on_event)).unwrap();
    assert_eq!(outcome, LoopOutcome::Interrupted { completed: 1 });
    drop(run);
    let interrupted = read_log(&cut.join("log.jsonl")).unwrap();
    assert_eq!(interrupted.len(), 2, "steps 0 and 1, every line whole");

    let run = new_run(&m, config(), &cut, 1e-3);
    let mut run = rt.block_on(run.resume()).unwrap();
    assert_eq!(run.state.step, 1);
    let outcome = rt
        .block_on(run.run(Arc::new(StopSignal::default()), no_events()))
        .unwrap();
    assert_eq!(outcome, LoopOutcome::Finished { steps: 3 });
    let resumed: Vec<StepLog> = read_log(&cut.join("log.jsonl"))
        .unwrap()
        .iter()
        .map(StepLog::without_timings)
        .collect();
    assert_eq!(resumed, expected);
}

/// Greedy eval reward of `test` under the engine's policy.
fn eval(
    rt: &tokio::runtime::Runtime,
    engine: &Engine,
    env: &Arc<dyn Environment>,
    test: &[QaSample],
) -> f64 {
    rt.block_on(evaluate(engine, env, test, MAX_STEP_TOKENS))
        .unwrap()
        .mean_reward
}

/// Most tokens per agent step in the learning runs: an oracle step is about 35.
const MAX_STEP_TOKENS: usize = 64;

/// A model for the learning test: two random layers of width 64 that speak the
/// default model's tokens (its vocabulary and chat template), so the calc protocol's
/// words are single tokens, as they are for a real model, and a few dozen steps teach
/// the format.
fn learner(dir: &Path) -> Arc<LoadedModel> {
    let vocab = Vocabulary::from_gguf(&common::default_model());
    let mut t = TinyModel::with_vocabulary(Flavour::Llama, 3, vocab, 64, 128);
    t.context = 2048;
    t.write_hf(dir, DType::F32, 1);
    Arc::new(LoadedModel::load(dir).unwrap())
}

/// The sizes of a warm-start-then-RL run.
struct Schedule {
    /// AdamW's learning rate for the warm-start and for the Tree-GRPO steps.
    lr_sft: f64,
    lr_rl: f64,
    /// Oracle demonstrations the warm-start trains on (batches of 8).
    demos: usize,
    epochs: usize,
    steps: u64,
    prompts_per_step: usize,
}

/// The eval rewards of a run: before anything, after the warm-start, and after each
/// evaluated RL step.
struct Rewards {
    before: f64,
    warm: f64,
    rl: Vec<f64>,
}

/// Warm-start then Tree-GRPO steps on calc, as `schedule` says, evaluating on 20 test
/// questions before, after the warm-start and every 4 RL steps.
fn warm_start_then_rl(m: &Arc<LoadedModel>, schedule: Schedule, out: &Path) -> Rewards {
    let Schedule {
        lr_sft,
        lr_rl,
        demos,
        epochs,
        steps,
        prompts_per_step,
    } = schedule;
    let rt = common::runtime();
    let (env, train, test) = calc(2, 150);
    let test = &test[..20];
    let engine = Engine::start(m.clone(), EngineConfig::default()).unwrap();
    let before = eval(&rt, &engine, &env, test);

    let params = Params::from_model(&m.model, DType::F32).unwrap();
    let cfg = SftConfig {
        epochs,
        batch_size: 8,
        ..SftConfig::default()
    };
    let ws = rt
        .block_on(warm_start(
            m,
            env.as_ref(),
            &train[..demos],
            &params,
            lr_sft,
            &cfg,
            &mut |_| {},
        ))
        .unwrap();
    assert_eq!(
        ws.demonstration_reward, 1.0,
        "the oracle solves every question"
    );
    rt.block_on(engine.load_weights(Arc::new(params.to_model(WeightFormat::F32).unwrap())))
        .unwrap();
    let warm = eval(&rt, &engine, &env, test);

    let config = LoopConfig {
        step_budget: None,
        eval_every_tokens: 0,
        eval_before: true,
        boosted_tokens: Default::default(),
        eval_every: 4,
        ..loop_config(
            steps,
            prompts_per_step,
            TreeShape::tree(2, 2, 1, Selection::Paper),
            3,
            MAX_STEP_TOKENS,
            test.len(),
            0,
        )
    };
    let optimizer = Optimizer::new(OptimizerConfig {
        lr: lr_rl,
        ..OptimizerConfig::default()
    });
    let mut run = TrainRun::new(
        engine.clone(),
        m.clone(),
        env.clone(),
        train[demos..].to_vec(),
        test.to_vec(),
        params,
        optimizer,
        config,
        out.to_path_buf(),
    )
    .unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let waves = Arc::new(Mutex::new(Vec::new()));
    let (seen, seen_waves) = (lines.clone(), waves.clone());
    let outcome = rt
        .block_on(run.run(
            Arc::new(StopSignal::default()),
            Box::new(move |e| {
                match e {
                    LoopEvent::Step(l) => seen.lock().unwrap().push(l.clone()),
                    LoopEvent::Rollout {
                        step,
                        wave,
                        progress,
                    } => seen_waves
                        .lock()
                        .unwrap()
                        .push((step, wave, progress.prompts_done)),
                    _ => {}
                }
            }),
        ))
        .unwrap();
    assert_eq!(outcome, LoopOutcome::Finished { steps });
    // Every step's rollout announces its wave before any prompt finishes (the
    // display's clock starts there), then counts its prompts up to all of them.
    let waves = waves.lock().unwrap();
    for step in 1..=steps {
        let events: Vec<_> = waves.iter().filter(|e| e.0 == step).collect();
        assert_eq!(events.first(), Some(&&(step, 1, 0)), "{waves:?}");
        assert_eq!(events.last().map(|e| e.2), Some(prompts_per_step));
        assert!(
            events.windows(2).all(|w| w[1].2 == w[0].2 + 1),
            "{events:?}"
        );
    }
    let lines = lines.lock().unwrap();
    assert_eq!(
        lines[0].eval_reward,
        Some(warm),
        "the loop's step 0 is the warm start"
    );
    for l in lines.iter() {
        eprintln!(
            "step {}: reward {:.3}, eval {:?}, loss {:.4}, grad norm {:.3}",
            l.step, l.reward_mean, l.eval_reward, l.loss, l.grad_norm
        );
    }
    Rewards {
        before,
        warm,
        rl: lines[1..].iter().filter_map(|l| l.eval_reward).collect(),
    }
}

#[test]
fn warm_start_and_tree_grpo_raise_the_eval_reward_and_learning_rate_zero_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let m = learner(&dir.path().join("model"));
    let learn = Schedule {
        lr_sft: 3e-3,
        lr_rl: 1e-3,
        demos: 32,
        epochs: 10,
        steps: 12,
        prompts_per_step: 8,
    };
    let r = warm_start_then_rl(&m, learn, &dir.path().join("learn"));
    eprintln!(
        "eval reward: before {:.3}, after the warm-start {:.3}, during RL {:?}",
        r.before, r.warm, r.rl
    );
    // Margins: the random model never writes the calc protocol (0 on these twenty
    // questions); ten epochs of demonstrations teach some of its format (measured
    // 0.115: a well-formed wrong answer scores 0.2), and twelve Tree-GRPO steps more
    // of it (measured 0.09, 0.115, 0.195 after steps 4, 8, 12; 0.195 again at 16).
    let after = *r.rl.last().unwrap();
    assert!(
        after >= r.before + 0.1,
        "eval reward {} → {after}",
        r.before
    );
    assert!(
        after >= r.warm + 0.04,
        "RL improves on the warm-start: {} → {after}",
        r.warm
    );

    // The control is smaller (CI time): an update at lr 0 must change nothing, and
    // one batch of demonstrations and one RL step on one prompt show it as well as
    // the learning run's sizes would.
    let control = Schedule {
        lr_sft: 0.0,
        lr_rl: 0.0,
        demos: 8,
        epochs: 1,
        steps: 1,
        prompts_per_step: 1,
    };
    let c = warm_start_then_rl(&m, control, &dir.path().join("control"));
    eprintln!("control (lr 0): {:.3}, {:.3}, {:?}", c.before, c.warm, c.rl);
    assert_eq!(c.before, r.before);
    assert_eq!(
        c.warm, c.before,
        "lr 0 leaves the weights, hence the greedy policy, as they were"
    );
    assert_eq!(c.rl, vec![c.before]);
}
