//! Multi-hop QA generation: 1-hop questions answered by one entity's
//! document ("Who founded Vellmar Instruments?") and 2-hop bridge questions
//! that need the answer of a first search to make the second ("Where was the
//! founder of Vellmar Instruments born?").

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::env::datagen::rng::{Rng, Uniform};
use crate::env::datagen::world::{World, WorldSizes};
use crate::env::datagen::Dataset;
use crate::env::error::EnvError;
use crate::env::ids::DocId;
use crate::env::sample::QaSample;

/// The seed of the committed `data/multihop` set.
pub const COMMITTED_MULTIHOP_SEED: u64 = 2509_21240;

/// Entity and question counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MultihopSizes {
    /// Rivers (named in town documents; no documents of their own). At least 1.
    pub rivers: usize,
    /// Towns, one document each. At least 1.
    pub towns: usize,
    /// People, one document each. At least 1.
    pub people: usize,
    /// Companies, one document each. At least 1.
    pub companies: usize,
    /// Products, one document each. At least 1.
    pub products: usize,
    /// Questions in the train split.
    pub train_questions: usize,
    /// Questions in the test split (disjoint from the train questions).
    pub test_questions: usize,
    /// Share of 2-hop questions in each split, in percent.
    pub two_hop_percent: u32,
}

impl MultihopSizes {
    /// The committed set: 2,700 documents, 300 train and 100 test questions.
    pub fn committed() -> Self {
        Self {
            rivers: 80,
            towns: 300,
            people: 900,
            companies: 500,
            products: 1000,
            train_questions: 300,
            test_questions: 100,
            two_hop_percent: 50,
        }
    }

    fn validate(&self) -> Result<(), EnvError> {
        let counts = [
            self.rivers,
            self.towns,
            self.people,
            self.companies,
            self.products,
        ];
        if counts.contains(&0) {
            return Err(EnvError::Config(
                "every entity count must be at least 1".into(),
            ));
        }
        if self.two_hop_percent > 100 {
            return Err(EnvError::Config(
                "two_hop_percent must be at most 100".into(),
            ));
        }
        Ok(())
    }
}

/// Question templates. 1-hop: one fact of one entity. 2-hop: a bridge
/// entity found in the first document, whose own document holds the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Template {
    Founder,
    Birthplace,
    Maker,
    TownRiver,
    Headquarters,
    ReleaseYear,
    FounderBirthplace,
    MakerFounder,
    MakerHeadquarters,
    BirthplaceRiver,
    HeadquartersRiver,
    FounderBirthYear,
}

const ONE_HOP: &[Template] = &[
    Template::Founder,
    Template::Birthplace,
    Template::Maker,
    Template::TownRiver,
    Template::Headquarters,
    Template::ReleaseYear,
];
const TWO_HOP: &[Template] = &[
    Template::FounderBirthplace,
    Template::MakerFounder,
    Template::MakerHeadquarters,
    Template::BirthplaceRiver,
    Template::HeadquartersRiver,
    Template::FounderBirthYear,
];

/// A question before it gets an id.
struct Draft {
    question: String,
    answers: Vec<String>,
    gold: Vec<DocId>,
    hops: u32,
    template: Template,
}

fn river_answers(w: &World, river: usize) -> Vec<String> {
    let r = &w.rivers[river];
    vec![format!("{r} River"), r.clone(), format!("River {r}")]
}

/// The subject's entity count for a template.
fn subjects(w: &World, t: Template) -> usize {
    use Template::*;
    match t {
        Founder | Headquarters | FounderBirthplace | HeadquartersRiver | FounderBirthYear => {
            w.companies.len()
        }
        Birthplace | BirthplaceRiver => w.people.len(),
        Maker | ReleaseYear | MakerFounder | MakerHeadquarters => w.products.len(),
        TownRiver => w.towns.len(),
    }
}

/// A question's text, its accepted answers and the documents that hold them.
type Facts = (String, Vec<String>, Vec<DocId>);

/// "Who founded C?", in one of two phrasings (one draw from `rng`).
fn founder(w: &World, i: usize, rng: &mut Rng) -> Facts {
    let c = &w.companies[i];
    let q = match rng.below(2) {
        0 => format!("Who founded {}?", c.name),
        _ => format!("Who is the founder of {}?", c.name),
    };
    (q, vec![w.full_name(c.founder)], vec![w.company_doc(i)])
}

/// "Where was P born?", in one of two phrasings (one draw from `rng`).
fn birthplace(w: &World, i: usize, rng: &mut Rng) -> Facts {
    let p = &w.people[i];
    let q = match rng.below(2) {
        0 => format!("Where was {} born?", w.full_name(i)),
        _ => format!("In which town was {} born?", w.full_name(i)),
    };
    (
        q,
        vec![w.towns[p.birth_town].name.clone()],
        vec![w.person_doc(i)],
    )
}

/// "Which company makes P?", in one of two phrasings (one draw from `rng`).
fn maker(w: &World, i: usize, rng: &mut Rng) -> Facts {
    let p = &w.products[i];
    let q = match rng.below(2) {
        0 => format!("Which company makes the {}?", p.name),
        _ => format!("Who manufactures the {}?", p.name),
    };
    (
        q,
        vec![w.companies[p.maker].name.clone()],
        vec![w.product_doc(i)],
    )
}

/// Builds template `t`'s question about subject `i`. Only the 1-hop
/// `Founder`, `Birthplace` and `Maker` templates draw from `rng` (to pick a
/// phrasing); every other template is fixed text.
fn draft(w: &World, t: Template, i: usize, rng: &mut Rng) -> Draft {
    use Template::*;
    let town = |k: usize| w.towns[k].name.clone();
    let (question, answers, gold): Facts = match t {
        Founder => founder(w, i, rng),
        Birthplace => birthplace(w, i, rng),
        Maker => maker(w, i, rng),
        TownRiver => {
            let q = format!("Which river flows through {}?", town(i));
            (q, river_answers(w, w.towns[i].river), vec![w.town_doc(i)])
        }
        Headquarters => {
            let c = &w.companies[i];
            let q = format!("Where is {} headquartered?", c.name);
            (q, vec![town(c.hq)], vec![w.company_doc(i)])
        }
        ReleaseYear => {
            let p = &w.products[i];
            let q = format!("In what year was the {} first released?", p.name);
            (q, vec![p.released.to_string()], vec![w.product_doc(i)])
        }
        FounderBirthplace => {
            let c = &w.companies[i];
            let q = format!("Where was the founder of {} born?", c.name);
            let a = town(w.people[c.founder].birth_town);
            (q, vec![a], vec![w.company_doc(i), w.person_doc(c.founder)])
        }
        MakerFounder => {
            let p = &w.products[i];
            let c = &w.companies[p.maker];
            let q = format!("Who founded the company that makes the {}?", p.name);
            (
                q,
                vec![w.full_name(c.founder)],
                vec![w.product_doc(i), w.company_doc(p.maker)],
            )
        }
        MakerHeadquarters => {
            let p = &w.products[i];
            let c = &w.companies[p.maker];
            let q = format!("Where is the maker of the {} headquartered?", p.name);
            (
                q,
                vec![town(c.hq)],
                vec![w.product_doc(i), w.company_doc(p.maker)],
            )
        }
        BirthplaceRiver => {
            let p = &w.people[i];
            let q = format!(
                "Which river flows through the town where {} was born?",
                w.full_name(i)
            );
            let a = river_answers(w, w.towns[p.birth_town].river);
            (q, a, vec![w.person_doc(i), w.town_doc(p.birth_town)])
        }
        HeadquartersRiver => {
            let c = &w.companies[i];
            let q = format!(
                "Which river flows through the town where {} is headquartered?",
                c.name
            );
            let a = river_answers(w, w.towns[c.hq].river);
            (q, a, vec![w.company_doc(i), w.town_doc(c.hq)])
        }
        FounderBirthYear => {
            let c = &w.companies[i];
            let q = format!("In what year was the founder of {} born?", c.name);
            let a = w.people[c.founder].birth_year.to_string();
            (q, vec![a], vec![w.company_doc(i), w.person_doc(c.founder)])
        }
    };
    Draft {
        question,
        answers,
        gold,
        hops: if ONE_HOP.contains(&t) { 1 } else { 2 },
        template: t,
    }
}

/// Draws `count` questions from `templates`, never repeating a (template,
/// subject) pair already in `seen`. Stops early if the world is too small
/// to give that many distinct questions.
fn draw(
    w: &World,
    templates: &[Template],
    count: usize,
    seen: &mut BTreeSet<(Template, usize)>,
    rng: &mut Rng,
) -> Vec<Draft> {
    let mut out = Vec::with_capacity(count);
    let mut attempts = 0usize;
    while out.len() < count && attempts < count.saturating_mul(100).max(1000) {
        attempts += 1;
        let Some(&t) = rng.pick(templates) else { break };
        let i = rng.below(subjects(w, t));
        if seen.insert((t, i)) {
            out.push(draft(w, t, i, rng));
        }
    }
    out
}

fn split(
    w: &World,
    name: &str,
    n: usize,
    pct: u32,
    seen: &mut BTreeSet<(Template, usize)>,
    rng: &mut Rng,
) -> Vec<QaSample> {
    let two = (n * pct as usize + 50) / 100;
    let mut drafts = draw(w, ONE_HOP, n - two, seen, rng);
    drafts.extend(draw(w, TWO_HOP, two, seen, rng));
    rng.shuffle(&mut drafts);
    drafts
        .into_iter()
        .enumerate()
        .map(|(k, d)| QaSample {
            id: crate::env::ids::SampleId::new(format!("{name}_{k:04}")),
            question: d.question,
            golden_answers: d.answers,
            hops: Some(d.hops),
            gold_doc_ids: d.gold,
            metadata: Some(serde_json::json!({ "template": format!("{:?}", d.template) })),
        })
        .collect()
}

/// Generates the multi-hop data set; the same seed and sizes give the same
/// bytes on every machine.
pub fn generate_multihop(seed: u64, sizes: MultihopSizes) -> Result<Dataset, EnvError> {
    sizes.validate()?;
    let mut rng = Rng::new(seed);
    let world = World::generate(
        &mut rng,
        WorldSizes {
            rivers: sizes.rivers,
            towns: sizes.towns,
            people: sizes.people,
            companies: sizes.companies,
            products: sizes.products,
        },
    );
    let corpus = world.documents(&mut rng);
    let mut seen = BTreeSet::new();
    let train = split(
        &world,
        "train",
        sizes.train_questions,
        sizes.two_hop_percent,
        &mut seen,
        &mut rng,
    );
    let test = split(
        &world,
        "test",
        sizes.test_questions,
        sizes.two_hop_percent,
        &mut seen,
        &mut rng,
    );
    Ok(Dataset {
        name: "multihop".into(),
        seed,
        params: serde_json::to_value(sizes).unwrap_or_default(),
        corpus,
        train,
        test,
    })
}
