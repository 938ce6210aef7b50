//! Multi-step arithmetic word problems with integer answers, for the calc
//! environment. Each problem keeps its reference expression in `metadata`,
//! so a test can check the answer with the calculator itself.

use crate::env::datagen::names::NameGen;
use crate::env::datagen::rng::{Rng, Uniform};
use crate::env::datagen::Dataset;
use crate::env::error::EnvError;
use crate::env::ids::SampleId;
use crate::env::sample::QaSample;

/// The seed of the committed `data/calc` set.
pub const COMMITTED_CALC_SEED: u64 = 2509_21241;
/// Sizes of the committed set (train, test).
pub const COMMITTED_CALC_SIZES: (usize, usize) = (150, 50);

/// A generated problem.
struct Problem {
    question: String,
    expression: String,
    answer: i64,
    steps: u32,
}

/// Draws one problem: one draw picks the template, then the template draws
/// its numbers (the order of draws is what makes the committed set).
fn problem(rng: &mut Rng, who: &str) -> Problem {
    match rng.below(10) {
        0 => marbles(rng, who),
        1 => bakery_boxes(rng),
        2 => train_distance(rng),
        3 => shop_profit(rng),
        4 => pizza_split(rng),
        5 => garden_percent(rng),
        6 => tank_level(rng),
        7 => weekly_savings(rng, who),
        8 => average_score(rng, who),
        _ => number_chain(rng),
    }
}

/// `a + b * c - d`: marbles bought in bags, some given away (`d` at most
/// the total, so the answer is never negative).
fn marbles(rng: &mut Rng, who: &str) -> Problem {
    let (a, b, c) = (rng.range(5, 60), rng.range(2, 12), rng.range(3, 25));
    let d = rng.range(1, a + b * c);
    Problem {
        question: format!("{who} has {a} marbles. {who} buys {b} bags with {c} marbles in each, then gives away {d} marbles. How many marbles does {who} have now?"),
        expression: format!("{a} + {b} * {c} - {d}"),
        answer: a + b * c - d,
        steps: 3,
    }
}

/// `(a * b - c) / d`: rolls sold and the rest boxed; `c` is chosen so the
/// division is exact and its quotient is the drawn `k`.
fn bakery_boxes(rng: &mut Rng) -> Problem {
    let (a, b, d) = (rng.range(3, 20), rng.range(6, 24), rng.range(2, 9));
    let k = rng.range(1, (a * b / d).max(1));
    let c = a * b - d * k;
    Problem {
        question: format!("A bakery bakes {a} trays of {b} rolls. It sells {c} rolls and packs the rest equally into {d} boxes. How many rolls are in each box?"),
        expression: format!("({a} * {b} - {c}) / {d}"),
        answer: k,
        steps: 3,
    }
}

/// `a * b + c * d`: distance over two legs at two speeds.
fn train_distance(rng: &mut Rng) -> Problem {
    let (a, b, c, d) = (
        rng.range(40, 120),
        rng.range(2, 6),
        rng.range(30, 110),
        rng.range(1, 5),
    );
    Problem {
        question: format!("A train travels at {a} km per hour for {b} hours, then at {c} km per hour for {d} hours. How many kilometres does it travel in total?"),
        expression: format!("{a} * {b} + {c} * {d}"),
        answer: a * b + c * d,
        steps: 3,
    }
}

/// `a * b * d - a * c`: revenue per apple minus cost per crate.
fn shop_profit(rng: &mut Rng) -> Problem {
    let (a, b, c) = (rng.range(3, 30), rng.range(10, 40), rng.range(5, 60));
    // Selling price per apple high enough that the shop profits.
    let d = c / b + rng.range(1, 4);
    Problem {
        question: format!("A shop buys {a} crates of {b} apples for {c} dollars per crate and sells every apple for {d} dollars. What is the shop's profit in dollars?"),
        expression: format!("{a} * {b} * {d} - {a} * {c}"),
        answer: a * b * d - a * c,
        steps: 4,
    }
}

/// `(a * b + c) / n`: a pizza bill plus tip split evenly; the tip `c`
/// rounds the bill up to a multiple of `n`.
fn pizza_split(rng: &mut Rng) -> Problem {
    let (n, a, b) = (rng.range(2, 8), rng.range(2, 9), rng.range(8, 25));
    let c = (n - (a * b) % n) % n + n * rng.range(0, 2);
    Problem {
        question: format!("{n} friends order {a} pizzas at {b} dollars each and leave a {c} dollar tip. They split the bill equally. How many dollars does each friend pay?"),
        expression: format!("({a} * {b} + {c}) / {n}"),
        answer: (a * b + c) / n,
        steps: 3,
    }
}

/// `rows * k * p / 100`: a percentage of a grid of plants; `k` is a
/// multiple of `100 / gcd(p, 100)` so the percentage is a whole number.
fn garden_percent(rng: &mut Rng) -> Problem {
    let p = *rng.pick(&[10i64, 20, 25, 40, 50, 75]).unwrap_or(&50);
    let unit = 100 / gcd(p, 100);
    let rows = rng.range(2, 12);
    let k = unit * rng.range(1, 6);
    Problem {
        question: format!("A garden has {rows} rows of {k} plants. {p}% of the plants are tomatoes. How many tomato plants are there?"),
        expression: format!("{rows} * {k} * {p} / 100"),
        answer: rows * k * p / 100,
        steps: 3,
    }
}

/// `a - b * c + d * e`: a tank drained then filled; it starts with at
/// least what is drained.
fn tank_level(rng: &mut Rng) -> Problem {
    let (b, c, d, e) = (
        rng.range(2, 15),
        rng.range(2, 10),
        rng.range(2, 15),
        rng.range(2, 10),
    );
    let a = b * c + rng.range(0, 200);
    Problem {
        question: format!("A tank holds {a} litres. It is drained at {b} litres per minute for {c} minutes and then filled at {d} litres per minute for {e} minutes. How many litres does it hold now?"),
        expression: format!("{a} - {b} * {c} + {d} * {e}"),
        answer: a - b * c + d * e,
        steps: 4,
    }
}

/// `a * b - a * b / 3`: weekly savings less a third; `a` is a multiple of
/// 3 so the third is exact.
fn weekly_savings(rng: &mut Rng, who: &str) -> Problem {
    let (a, b) = (3 * rng.range(2, 20), rng.range(3, 12));
    Problem {
        question: format!("{who} saves {a} dollars every week for {b} weeks, then spends a third of the savings on a bike. How many dollars are left?"),
        expression: format!("{a} * {b} - {a} * {b} / 3"),
        answer: a * b - a * b / 3,
        steps: 3,
    }
}

/// `(x1 + x2 + x3 + x4) / 4`: an average of four scores; the fourth is
/// rounded up so the sum divides by 4.
fn average_score(rng: &mut Rng, who: &str) -> Problem {
    let xs: Vec<i64> = (0..3).map(|_| rng.range(10, 40)).collect();
    let sum: i64 = xs.iter().sum();
    let x4 = rng.range(10, 40);
    let x4 = x4 + (4 - (sum + x4) % 4) % 4;
    Problem {
        question: format!("{who} scored {}, {}, {} and {x4} points in four games. What was the average score per game?", xs[0], xs[1], xs[2]),
        expression: format!("({} + {} + {} + {x4}) / 4", xs[0], xs[1], xs[2]),
        answer: (sum + x4) / 4,
        steps: 4,
    }
}

/// `(a * b + c) / d`: a number multiplied, added to and divided; `c` makes
/// the division exact.
fn number_chain(rng: &mut Rng) -> Problem {
    let (a, b, d) = (rng.range(2, 30), rng.range(2, 9), rng.range(2, 7));
    let c = (d - (a * b) % d) % d + d * rng.range(0, 5);
    Problem {
        question: format!("A number starts at {a}. It is multiplied by {b}, then {c} is added, then the result is divided by {d}. What is the final number?"),
        expression: format!("({a} * {b} + {c}) / {d}"),
        answer: (a * b + c) / d,
        steps: 3,
    }
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a.max(1)
    } else {
        gcd(b, a % b)
    }
}

fn samples(rng: &mut Rng, names: &[String], split: &str, n: usize) -> Vec<QaSample> {
    (0..n)
        .map(|k| {
            let who = rng.pick(names).cloned().unwrap_or_else(|| "Mira".into());
            let p = problem(rng, &who);
            QaSample {
                id: SampleId::new(format!("calc_{split}_{k:04}")),
                question: p.question,
                golden_answers: vec![p.answer.to_string()],
                hops: None,
                gold_doc_ids: Vec::new(),
                metadata: Some(serde_json::json!({ "expression": p.expression, "steps": p.steps })),
            }
        })
        .collect()
}

/// Generates `train` + `test` problems from `seed` (no corpus).
pub fn generate_calc(seed: u64, train: usize, test: usize) -> Result<Dataset, EnvError> {
    let mut rng = Rng::new(seed);
    let mut gen = NameGen::new();
    let names: Vec<String> = (0..40).map(|_| gen.word(&mut rng)).collect();
    let train_set = samples(&mut rng, &names, "train", train);
    let test_set = samples(&mut rng, &names, "test", test);
    Ok(Dataset {
        name: "calc".into(),
        seed,
        params: serde_json::json!({ "train": train, "test": test }),
        corpus: Vec::new(),
        train: train_set,
        test: test_set,
    })
}
