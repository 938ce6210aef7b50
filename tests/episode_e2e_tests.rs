//! Agent episodes end to end on the default model: greedy 3-turn search-QA episodes
//! through the engine all end, and each trajectory's loss mask is 0 exactly on the
//! observation tokens.

mod common;

use std::path::Path;
use std::sync::Arc;

use treegrpo::engine::{Engine, EngineConfig};
use treegrpo::env::{load_samples, EnvConfig, Environment, SearchQaEnv, DEFAULT_TOP_K};
use treegrpo::model::LoadedModel;
use treegrpo::rollout::{run_episode, EpisodeParams};

fn data(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/multihop")
        .join(path)
}

/// Token spans of `mask` equal to `value`, in order.
fn spans(ids: &[u32], mask: &[u8], value: u8) -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = Vec::new();
    let mut prev = None;
    for (&t, &m) in ids.iter().zip(mask) {
        if m == value {
            if prev != Some(value) {
                out.push(Vec::new());
            }
            out.last_mut().unwrap().push(t);
        }
        prev = Some(m);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_search_qa_episodes_end_and_mask_exactly_the_observations() {
    let model = Arc::new(LoadedModel::load(&common::default_model()).unwrap());
    let engine = Engine::start(model.clone(), EngineConfig::default()).unwrap();
    let cfg = EnvConfig {
        max_turns: 3,
        ..EnvConfig::default()
    };
    let env: Arc<dyn Environment> =
        Arc::new(SearchQaEnv::from_corpus_file(&data("corpus.jsonl"), DEFAULT_TOP_K, cfg).unwrap());
    let samples = load_samples(&data("test.jsonl")).unwrap();
    let params = EpisodeParams {
        max_step_tokens: 96,
        ..EpisodeParams::default()
    };

    // All episodes run concurrently: their steps share the engine's batches.
    let mut tasks = Vec::new();
    for sample in samples.into_iter().take(6) {
        let (engine, env, params) = (engine.clone(), env.clone(), params.clone());
        tasks.push(tokio::spawn(async move {
            run_episode(&engine, env.as_ref(), &sample, &params)
                .await
                .unwrap()
        }));
    }
    for task in tasks {
        let (traj, episode) = task.await.unwrap();
        assert!(episode.is_done(), "episode ended");
        assert!(
            traj.num_turns >= 1 && traj.num_turns <= 4,
            "turns: {}",
            traj.num_turns
        );
        assert_eq!(traj.response_ids.len(), traj.response_mask.len());
        assert_eq!(traj.response_ids.len(), traj.response_logprobs.len());

        // Model spans decode to the step texts; observation spans to the observations.
        let model_spans = spans(&traj.response_ids, &traj.response_mask, 1);
        let obs_spans = spans(&traj.response_ids, &traj.response_mask, 0);
        let steps = episode.steps();
        let observations: Vec<&str> = steps
            .iter()
            .filter_map(|s| s.observation.as_deref())
            .collect();
        assert_eq!(model_spans.len(), steps.len());
        for (span, step) in model_spans.iter().zip(steps) {
            assert_eq!(model.tokenizer.decode(span).unwrap(), step.text);
        }
        // The last step's observation (if any) ends the episode and is not appended.
        let appended = if episode.is_done() && steps.last().is_some_and(|s| s.observation.is_some())
        {
            &observations[..observations.len() - 1]
        } else {
            &observations[..]
        };
        assert_eq!(obs_spans.len(), appended.len());
        for (span, obs) in obs_spans.iter().zip(appended) {
            assert_eq!(&model.tokenizer.decode(span).unwrap(), obs);
        }
        for (lp, m) in traj.response_logprobs.iter().zip(&traj.response_mask) {
            if *m == 0 {
                assert_eq!(*lp, 0.0);
            } else {
                assert!(*lp <= 0.0 && lp.is_finite());
            }
        }
        assert!(traj.score.is_some());
    }
    let stats = engine.stats().await.unwrap();
    assert_eq!(stats.kv.in_use, 0, "every episode freed its sequence");
}
