//! The fictional world behind the multi-hop data set: towns on rivers,
//! people born in towns, companies founded by people and headquartered in
//! towns, products made by companies. Each entity gets one document that
//! states its own facts (and only its own, so a two-hop question really
//! needs two searches) plus distractor sentences that mention other
//! entities in relations no question asks about.

use crate::env::corpus::Document;
use crate::env::datagen::names::NameGen;
use crate::env::datagen::rng::{Rng, Uniform};
use crate::env::ids::DocId;

/// Company sectors: name suffix, industry phrase, product kinds.
const SECTORS: &[(&str, &str, &[&str])] = &[
    (
        "Instruments",
        "scientific instrument",
        &["barometer", "theodolite", "pocket compass"],
    ),
    (
        "Optics",
        "optics",
        &["telescope", "camera lens", "microscope"],
    ),
    (
        "Motors",
        "engine",
        &["tractor", "motorcycle", "marine engine"],
    ),
    (
        "Textiles",
        "textile",
        &["wool blanket", "rain coat", "sailcloth"],
    ),
    ("Brewing", "brewing", &["pale ale", "barley wine", "cider"]),
    (
        "Works",
        "ironworks",
        &["cast-iron stove", "water pump", "bicycle frame"],
    ),
    ("Press", "publishing", &["atlas", "almanac", "field guide"]),
    (
        "Labs",
        "electronics",
        &["radio receiver", "pocket calculator", "amplifier"],
    ),
];

const OCCUPATIONS: &[&str] = &[
    "engineer",
    "painter",
    "chemist",
    "cartographer",
    "composer",
    "merchant",
    "architect",
    "botanist",
    "journalist",
    "watchmaker",
    "physician",
    "poet",
];

/// A town of the world. Indices (`river`, `region`, `twin`) point into the
/// [`World`]'s lists.
pub struct Town {
    /// The town's invented name (unique in the world).
    pub name: String,
    /// The river it lies on (index into [`World::rivers`]).
    pub river: usize,
    /// Its region (index into [`World::regions`]).
    pub region: usize,
    /// The year it was founded.
    pub founded: i64,
    /// Its inhabitants (a multiple of 100).
    pub population: i64,
    /// Another town it may be said to be twinned with (a distractor fact).
    pub twin: usize,
}

/// A person of the world. Town indices point into [`World::towns`], person
/// indices into [`World::people`].
pub struct Person {
    /// First name; first names repeat across people.
    pub first: String,
    /// Surname, unique in the world.
    pub last: String,
    /// The town they were born in (what 2-hop questions ask).
    pub birth_town: usize,
    /// The town they later moved to (a distractor; equal to `birth_town` when
    /// they did not move).
    pub moved_to: usize,
    /// A town they may be said to have lectured in (a distractor).
    pub lecture_town: usize,
    /// The year they were born.
    pub birth_year: i64,
    /// Their occupation (`"engineer"`, `"painter"`, ...).
    pub occupation: &'static str,
    /// Another person they may be said to be confused with (a distractor).
    pub confused_with: usize,
}

/// A company of the world.
pub struct Company {
    /// Invented name plus the sector's suffix (`"Vellmar Instruments"`).
    pub name: String,
    /// Its sector (index into the generator's sector table: name suffix,
    /// industry, product kinds).
    pub sector: usize,
    /// The person who founded it (index into [`World::people`]).
    pub founder: usize,
    /// The town it is headquartered in (index into [`World::towns`]), never the
    /// founder's birth town, so a 2-hop question has no shortcut.
    pub hq: usize,
    /// The year it was founded (22 to 45 years after its founder's birth).
    pub founded: i64,
    /// Another company it may be said to rival (a distractor).
    pub rival: usize,
}

/// A product of the world.
pub struct Product {
    /// Invented name, sometimes with a model number (`"Drelok 450"`).
    pub name: String,
    /// What it is (`"barometer"`, `"telescope"`, ...), from its maker's sector.
    pub kind: &'static str,
    /// The company that makes it (index into [`World::companies`]).
    pub maker: usize,
    /// The year it was first released (after its maker was founded).
    pub released: i64,
    /// Another product reviewers may be said to compare it with (a distractor).
    pub compared_with: usize,
}

/// All entities; document ids follow the order towns, people, companies,
/// products.
pub struct World {
    /// River names, without the word "River" (rivers have no document).
    pub rivers: Vec<String>,
    /// Region names (twelve; regions have no document).
    pub regions: Vec<String>,
    /// The towns, in document order.
    pub towns: Vec<Town>,
    /// The people, in document order.
    pub people: Vec<Person>,
    /// The companies, in document order.
    pub companies: Vec<Company>,
    /// The products, in document order.
    pub products: Vec<Product>,
}

/// How many of each entity. Every count must be at least 1.
#[derive(Debug, Clone, Copy)]
pub struct WorldSizes {
    /// Rivers (no documents of their own).
    pub rivers: usize,
    /// Towns, one document each.
    pub towns: usize,
    /// People, one document each.
    pub people: usize,
    /// Companies, one document each.
    pub companies: usize,
    /// Products, one document each.
    pub products: usize,
}

/// Another index than `me` in `0..n` (or `me` when `n` is 1).
fn other(rng: &mut Rng, n: usize, me: usize) -> usize {
    if n < 2 {
        return me;
    }
    (me + 1 + rng.below(n - 1)) % n
}

impl World {
    /// Builds the world. Every count must be at least 1 (checked by the caller).
    pub fn generate(rng: &mut Rng, s: WorldSizes) -> Self {
        let mut names = NameGen::new();
        let rivers: Vec<String> = (0..s.rivers).map(|_| names.word(rng)).collect();
        let regions: Vec<String> = (0..12).map(|_| names.word(rng)).collect();
        // First names repeat across people, as in real life; surnames do not.
        let firsts: Vec<String> = (0..60).map(|_| names.word(rng)).collect();
        let towns = (0..s.towns)
            .map(|i| Town {
                name: names.word(rng),
                river: rng.below(s.rivers),
                region: rng.below(regions.len()),
                founded: rng.range(1150, 1850),
                population: rng.range(8, 900) * 100,
                twin: other(rng, s.towns, i),
            })
            .collect();
        let people = (0..s.people)
            .map(|i| Person {
                first: rng.pick(&firsts).cloned().unwrap_or_default(),
                last: names.word(rng),
                birth_town: rng.below(s.towns),
                moved_to: rng.below(s.towns),
                lecture_town: rng.below(s.towns),
                birth_year: rng.range(1820, 1950),
                occupation: rng.pick(OCCUPATIONS).copied().unwrap_or("engineer"),
                confused_with: other(rng, s.people, i),
            })
            .collect::<Vec<_>>();
        // Founders are distinct people while there are enough of them.
        let mut founders: Vec<usize> = (0..s.people).collect();
        rng.shuffle(&mut founders);
        let companies = (0..s.companies)
            .map(|i| {
                let sector = rng.below(SECTORS.len());
                let founder = founders
                    .get(i)
                    .copied()
                    .unwrap_or_else(|| rng.below(s.people));
                let (born, birth_town) = people
                    .get(founder)
                    .map_or((1900, 0), |p: &Person| (p.birth_year, p.birth_town));
                // Not in the founder's birth town: the company document
                // would otherwise name the answer of "where was the founder
                // of X born?" and give the 2-hop question a shortcut.
                Company {
                    name: format!("{} {}", names.word(rng), SECTORS[sector].0),
                    sector,
                    founder,
                    hq: other(rng, s.towns, birth_town),
                    founded: born + rng.range(22, 45),
                    rival: other(rng, s.companies, i),
                }
            })
            .collect::<Vec<Company>>();
        let products = (0..s.products)
            .map(|i| {
                let maker = rng.below(s.companies);
                let c = &companies[maker];
                let kinds = SECTORS[c.sector].2;
                let mut name = names.word(rng);
                if rng.percent(40) {
                    name = format!("{name} {}", rng.range(10, 99) * 10);
                }
                Product {
                    name,
                    kind: rng.pick(kinds).copied().unwrap_or("device"),
                    maker,
                    released: c.founded + rng.range(1, 25),
                    compared_with: other(rng, s.products, i),
                }
            })
            .collect();
        Self {
            rivers,
            regions,
            towns,
            people,
            companies,
            products,
        }
    }

    /// `"Name River"`, as documents and questions write it. Panics on an index
    /// past [`World::rivers`] (indices come from the world itself).
    pub fn river_name(&self, river: usize) -> String {
        format!("{} River", self.rivers[river])
    }

    /// A person's `"First Last"` (their document's title). Panics on an index
    /// past [`World::people`].
    pub fn full_name(&self, person: usize) -> String {
        let p = &self.people[person];
        format!("{} {}", p.first, p.last)
    }

    /// The document id of town `i` (`doc00000`, ...: towns come first).
    pub fn town_doc(&self, i: usize) -> DocId {
        DocId::new(format!("doc{i:05}"))
    }
    /// The document id of person `i` (numbered after the towns).
    pub fn person_doc(&self, i: usize) -> DocId {
        self.town_doc(self.towns.len() + i)
    }
    /// The document id of company `i` (numbered after the people).
    pub fn company_doc(&self, i: usize) -> DocId {
        self.person_doc(self.people.len() + i)
    }
    /// The document id of product `i` (numbered after the companies).
    pub fn product_doc(&self, i: usize) -> DocId {
        self.company_doc(self.companies.len() + i)
    }

    /// One document per entity, in id order. Sentence variants are chosen
    /// by `rng` so documents do not all read alike.
    pub fn documents(&self, rng: &mut Rng) -> Vec<Document> {
        let mut docs = Vec::new();
        for (i, t) in self.towns.iter().enumerate() {
            let n = &t.name;
            let mut text = format!(
                "{n} is a town in the {} region. The {} flows through {n}. ",
                self.regions[t.region],
                self.river_name(t.river)
            );
            text += &format!(
                "{n} was founded in {} and has about {} inhabitants.",
                t.founded, t.population
            );
            if rng.percent(60) {
                text += &format!(" It is twinned with {}.", self.towns[t.twin].name);
            }
            docs.push(doc(self.town_doc(i), n, text));
        }
        for (i, p) in self.people.iter().enumerate() {
            let full = self.full_name(i);
            let last = &p.last;
            let birth = &self.towns[p.birth_town].name;
            let mut text = match rng.below(2) {
                0 => format!(
                    "{full} (born {}) is {}. {last} was born in {birth}",
                    p.birth_year,
                    a(p.occupation)
                ),
                _ => format!(
                    "{full} (born {}) is {} who was born in {birth}",
                    p.birth_year,
                    a(p.occupation)
                ),
            };
            if p.moved_to != p.birth_town {
                text += &format!(" and later moved to {}", self.towns[p.moved_to].name);
            }
            text.push('.');
            if rng.percent(50) {
                let o = &self.people[p.confused_with];
                text += &format!(
                    " {last} is sometimes confused with {} {}, {}.",
                    o.first,
                    o.last,
                    a(o.occupation)
                );
            }
            if rng.percent(50) {
                let year = p.birth_year + rng.range(25, 60);
                text += &format!(
                    " In {year}, {last} gave a lecture in {}.",
                    self.towns[p.lecture_town].name
                );
            }
            docs.push(doc(self.person_doc(i), &full, text));
        }
        for (i, c) in self.companies.iter().enumerate() {
            let n = &c.name;
            let founder = self.full_name(c.founder);
            let hq = &self.towns[c.hq].name;
            let industry = a(SECTORS[c.sector].1);
            let mut text = match rng.below(2) {
                0 => format!("{n} is {industry} company headquartered in {hq}. It was founded in {} by {founder}.", c.founded),
                _ => format!("{n} is {industry} company founded by {founder} in {}. {n} is headquartered in {hq}.", c.founded),
            };
            if rng.percent(60) {
                text += &format!(" Its main rival is {}.", self.companies[c.rival].name);
            }
            docs.push(doc(self.company_doc(i), n, text));
        }
        for (i, p) in self.products.iter().enumerate() {
            let n = &p.name;
            let maker = &self.companies[p.maker].name;
            let mut text = format!(
                "The {n} is {} made by {maker}. The {n} was first released in {}.",
                a(p.kind),
                p.released
            );
            if rng.percent(50) {
                text += &format!(
                    " Reviewers often compare it with the {}.",
                    self.products[p.compared_with].name
                );
            }
            docs.push(doc(self.product_doc(i), n, text));
        }
        docs
    }
}

/// `a word` or `an word`.
fn a(word: &str) -> String {
    let vowel = word.starts_with(['a', 'e', 'i', 'o', 'u']);
    format!("{} {word}", if vowel { "an" } else { "a" })
}

fn doc(id: DocId, title: &str, text: String) -> Document {
    Document {
        id,
        title: title.to_owned(),
        text,
    }
}
