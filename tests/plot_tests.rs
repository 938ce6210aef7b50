//! Reward curves as SVG: every run's curve, eval dots and label are drawn, and the
//! chart keeps its legend beside the plot.

use treegrpo::view::plot::{reward_svg, RewardSeries};

fn series(label: &str, scale: f64) -> RewardSeries {
    RewardSeries {
        label: label.to_string(),
        reward: (1..=4)
            .map(|s| (s as f64 * 1000.0, 0.1 * scale * s as f64))
            .collect(),
        eval: vec![(0.0, 0.2), (2000.0, 0.3 * scale), (4000.0, 0.4 * scale)],
    }
}

#[test]
fn every_run_gets_its_curve_its_eval_dots_and_its_label() {
    let runs = [
        series("tree-2-2-1-seed1", 1.0),
        series("chain-4-seed1", 0.8),
    ];
    let svg = reward_svg(&runs, 900, 560).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    for r in &runs {
        assert!(svg.contains(&r.label), "{} is labelled", r.label);
    }
    // Three eval dots per run on the chart, one dot per run in the legend.
    assert_eq!(svg.matches("<circle").count(), runs.len() * (3 + 1));
    // Each run draws its rollout curve and its eval curve as one polyline each.
    assert!(svg.matches("<polyline").count() >= 2 * runs.len());
}

#[test]
fn an_empty_run_still_draws_a_chart() {
    let empty = RewardSeries {
        label: "nothing yet".into(),
        reward: vec![],
        eval: vec![],
    };
    let svg = reward_svg(&[empty], 600, 400).unwrap();
    assert!(svg.contains("nothing yet"));
    assert!(svg.contains("reward vs tokens computed"));
}
