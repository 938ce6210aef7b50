//! The calc environment: the safe evaluator's table and limits, a fuzz
//! loop, the generated problems (each checked with the evaluator), and an
//! episode.

use treegrpo::env::calc_eval::{calculate, evaluate, CalcError};
use treegrpo::env::datagen::{generate_calc, COMMITTED_CALC_SEED, COMMITTED_CALC_SIZES};
use treegrpo::env::protocol::invalid_action_feedback;
use treegrpo::env::{load_samples, ActionKind, CalcEnv, EnvConfig, Environment, QaSample, Tags};

#[test]
fn calc_evaluator_table() {
    let ok = [
        ("1 + 2 * 3", "7"),
        ("(1 + 2) * 3", "9"),
        ("-3 - -2", "-1"),
        ("+4", "4"),
        ("10 / 4", "2.5"),
        ("0.1 + 0.2", "0.3"),
        (".5 * 4", "2"),
        ("2 × 3 − 1 ÷ 2", "5.5"),
        ("  ( ( 7 ) )  ", "7"),
        ("1 / 3", "0.3333333333"),
        ("1000000000000000", "1000000000000000"),
        ("8 - 2 - 1", "5"),
        ("24 / 4 / 2", "3"),
    ];
    for (expr, want) in ok {
        assert_eq!(calculate(expr).as_deref(), Ok(want), "{expr}");
    }
    let deep_ok = format!("{}1{}", "(".repeat(32), ")".repeat(32));
    assert_eq!(evaluate(&deep_ok), Ok(1.0));
    let err = [
        ("1 / 0", CalcError::DivisionByZero),
        ("1 / (2 - 2)", CalcError::DivisionByZero),
        ("", CalcError::Empty),
        ("   ", CalcError::Empty),
        ("1 +", CalcError::UnexpectedEnd),
        ("(1 + 2", CalcError::UnexpectedEnd),
        ("1 + 2)", CalcError::UnexpectedChar { ch: ')', pos: 5 }),
        ("2 ^ 3", CalcError::UnexpectedChar { ch: '^', pos: 2 }),
        ("sqrt(4)", CalcError::UnexpectedChar { ch: 's', pos: 0 }),
        ("1.2.3", CalcError::UnexpectedChar { ch: '.', pos: 3 }),
        (".", CalcError::InvalidNumber { pos: 0 }),
        ("1e3", CalcError::UnexpectedChar { ch: 'e', pos: 1 }),
        ("10000000000000000", CalcError::OutOfRange),
        ("100000000 * 100000000", CalcError::OutOfRange),
        ("1000000000000000 + 1", CalcError::OutOfRange),
    ];
    for (expr, want) in err {
        assert_eq!(evaluate(expr), Err(want), "{expr}");
    }
    let too_deep = format!("{}1{}", "(".repeat(33), ")".repeat(33));
    assert_eq!(evaluate(&too_deep), Err(CalcError::TooDeep));
    assert_eq!(evaluate(&"-".repeat(40).add_one()), Err(CalcError::TooDeep));
    assert_eq!(
        evaluate(&"1+".repeat(100).add_one()),
        Err(CalcError::TooLong)
    );
    assert_eq!(evaluate(&"1+".repeat(99).add_one()), Ok(100.0));
}

trait AddOne {
    fn add_one(self) -> String;
}
impl AddOne for String {
    fn add_one(self) -> String {
        self + "1"
    }
}

#[test]
fn calc_fuzz_never_panics() {
    const PIECES: &[&str] = &[
        "1", "0", "9.5", ".", "+", "-", "*", "/", "(", ")", " ", "−", "×", "e", "é", "1e308",
    ];
    let mut x: u64 = 0xDEAD_BEEF;
    for _ in 0..5000 {
        let mut expr = String::new();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        for k in 0..(x % 60) {
            expr.push_str(PIECES[((x >> (k % 50)) as usize + k as usize) % PIECES.len()]);
        }
        if let Ok(v) = evaluate(&expr) {
            assert!(v.is_finite() && v.abs() <= 1e15, "{expr}: {v}");
        }
    }
}

#[test]
fn generated_problems_check_out() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/calc");
    let mut all = load_samples(&root.join("train.jsonl")).expect("committed train");
    all.extend(load_samples(&root.join("test.jsonl")).expect("committed test"));
    let (train, test) = COMMITTED_CALC_SIZES;
    assert_eq!(all.len(), train + test);
    let fresh = generate_calc(COMMITTED_CALC_SEED, train, test).expect("generate");
    assert_eq!(
        all,
        [fresh.train, fresh.test].concat(),
        "data/calc differs from its generator; regenerate it"
    );
    for seed in 0..20 {
        all.extend(generate_calc(seed, 50, 0).expect("generate").train);
    }
    for s in &all {
        let expr = s
            .metadata
            .as_ref()
            .and_then(|m| m["expression"].as_str())
            .expect("expression");
        let answer: i64 = s.golden_answers[0].parse().expect("integer answer");
        assert!(answer >= 0, "{}: {answer}", s.id);
        assert_eq!(
            calculate(expr).as_deref(),
            Ok(s.golden_answers[0].as_str()),
            "{}: {expr}",
            s.id
        );
    }
}

#[tokio::test]
async fn calc_episode() {
    let env = CalcEnv::new(EnvConfig::default()).expect("env");
    assert_eq!(env.stop_strings(), ["</calc>", "</answer>"]);
    let s = QaSample::new("c1", "What is 6 times 7?", vec!["42".into()]);
    let mut ep = env.start(&s).unwrap();
    assert!(ep.prompt()[0].content.contains("<calc> expression </calc>"));
    let o = env
        .step(&mut ep, "<think>Multiply.</think><calc>6 * 7</calc>")
        .await
        .expect("step");
    assert_eq!(
        o.observation.as_deref(),
        Some("\n\n<information>42</information>\n\n")
    );
    let o = env
        .step(&mut ep, "<think>Check.</think><calc>6 / 0</calc>")
        .await
        .expect("step");
    assert_eq!(
        o.observation.as_deref(),
        Some(
            "\n\n<information>Tool error (calc): invalid input: division by zero</information>\n\n"
        )
    );
    let o = env
        .step(&mut ep, "<think>So 42.</think><answer>42</answer>")
        .await
        .expect("step");
    assert!(o.done);
    assert_eq!(env.score(&ep).reward, 1.0);
    let fb = invalid_action_feedback(&Tags::default(), ActionKind::Calc);
    assert!(fb.contains(
        "If I want to calculate, I should put the expression between <calc> and </calc>."
    ));
}
