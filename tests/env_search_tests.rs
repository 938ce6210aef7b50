//! Search-qa tests: corpus format, BM25, the committed multi-hop data
//! (integrity, determinism, retrieval rate) and a scripted 2-hop episode.

use std::path::{Path, PathBuf};

use treegrpo::env::bm25::{tokenize, Bm25Index, Bm25Params};
use treegrpo::env::corpus::{format_results, CorpusRecord};
use treegrpo::env::datagen::{generate_multihop, MultihopSizes, COMMITTED_MULTIHOP_SEED};
use treegrpo::env::{
    load_samples, Bm25Retriever, Corpus, DocId, Document, EnvConfig, EnvError, Environment,
    QaSample, SearchQaEnv, DEFAULT_TOP_K,
};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/multihop")
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("treegrpo-env-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn corpus_titles_and_result_format() {
    let rec = |id: &str, contents: &str| CorpusRecord {
        id: DocId::new(id),
        contents: contents.to_owned(),
    };
    let a = Document::from_record(rec(
        "1",
        "\"Vellmar Instruments\"\nA company.\nSecond line.",
    ));
    assert_eq!(
        (a.title.as_str(), a.text.as_str()),
        ("Vellmar Instruments", "A company.\nSecond line.")
    );
    let b = Document::from_record(rec("2", "Plain title\ntext"));
    assert_eq!(b.title, "Plain title");
    let c = Document::from_record(rec("3", "\"Only a title\""));
    assert_eq!((c.title.as_str(), c.text.as_str()), ("Only a title", ""));
    assert_eq!(Document::from_record(a.to_record()), a);
    assert_eq!(
        format_results([&a, &b]),
        "Doc 1(Title: Vellmar Instruments) A company.\nSecond line.\nDoc 2(Title: Plain title) text"
    );
}

#[test]
fn tokenizer_and_bm25_basics() {
    assert_eq!(
        tokenize("Who founded Vellmar-Instruments in 1931?"),
        ["founded", "vellmar", "instruments", "1931"]
    );
    let texts = [
        "the river sorn flows",
        "sorn sorn sorn river",
        "an unrelated text",
        "river",
    ];
    let idx = Bm25Index::build(&texts, Bm25Params::default());
    let hits = idx.search("sorn river", 10);
    assert_eq!(hits.iter().map(|h| h.doc).collect::<Vec<_>>(), [1, 0, 3]);
    assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));
    assert!(idx.search("the of and", 3).is_empty(), "stop words only");
    assert!(idx.search("", 3).is_empty());
    // Ties break on document order.
    let same = Bm25Index::build(&["x y", "x y", "x y"], Bm25Params::default());
    assert_eq!(
        same.search("x", 2)
            .iter()
            .map(|h| h.doc)
            .collect::<Vec<_>>(),
        [0, 1]
    );
}

#[test]
fn bad_data_files_are_errors() {
    let dir = scratch_dir("bad");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        p
    };
    let p = write(
        "c.jsonl",
        "{\"id\":\"1\",\"contents\":\"\\\"T\\\"\\nx\"}\n\nnot json\n",
    );
    assert!(matches!(
        Corpus::load_jsonl(&p),
        Err(EnvError::JsonLine { line: 3, .. })
    ));
    let p = write(
        "dup.jsonl",
        "{\"id\":1,\"contents\":\"a\"}\n{\"id\":\"1\",\"contents\":\"b\"}\n",
    );
    assert!(matches!(
        Corpus::load_jsonl(&p),
        Err(EnvError::BadRecord { line: 2, .. })
    ));
    let p = write("q.jsonl", "{\"id\":7,\"question\":\"Q?\",\"golden_answers\":[\"a\"]}\n{\"id\":\"8\",\"question\":\"Q?\",\"golden_answers\":[]}\n");
    assert!(matches!(
        load_samples(&p),
        Err(EnvError::BadRecord { line: 2, .. })
    ));
    let p = write("ok.jsonl", "{\"id\":7,\"question\":\"Q?\",\"golden_answers\":[\"a\"],\"metadata\":{\"x\":1},\"extra\":true}\n");
    let ok = load_samples(&p).expect("numeric ids and unknown fields are fine");
    assert_eq!(ok[0].id.as_str(), "7");
    assert!(matches!(
        load_samples(&dir.join("missing.jsonl")),
        Err(EnvError::Io { .. })
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

fn committed() -> (Corpus, Vec<QaSample>) {
    let dir = data_dir();
    let corpus = Corpus::load_jsonl(&dir.join("corpus.jsonl")).expect("committed corpus");
    let mut samples = load_samples(&dir.join("train.jsonl")).expect("train");
    samples.extend(load_samples(&dir.join("test.jsonl")).expect("test"));
    (corpus, samples)
}

#[test]
fn committed_data_is_consistent() {
    let (corpus, samples) = committed();
    assert!(
        (2000..=3000).contains(&corpus.len()),
        "{} documents",
        corpus.len()
    );
    assert!(samples.len() >= 300);
    for s in &samples {
        let hops = s.hops.expect("hops") as usize;
        assert_eq!(s.gold_doc_ids.len(), hops, "{}", s.id);
        // The answer is stated in the last gold document; for 2-hop the
        // bridge entity (second document's title) is named in the first.
        let docs: Vec<&Document> = s
            .gold_doc_ids
            .iter()
            .map(|id| corpus.get(id).expect("gold doc exists"))
            .collect();
        let last = docs[hops - 1];
        assert!(
            s.golden_answers
                .iter()
                .any(|a| last.text.contains(a.as_str())),
            "{}: answer not in {}",
            s.id,
            last.id
        );
        if hops == 2 {
            assert!(
                docs[0].text.contains(docs[1].title.as_str()),
                "{}: no bridge",
                s.id
            );
            assert!(
                !docs[0].text.contains(s.golden_answers[0].as_str()),
                "{}: shortcut",
                s.id
            );
        }
    }
    let ids: std::collections::BTreeSet<_> = samples.iter().map(|s| s.question.clone()).collect();
    assert_eq!(ids.len(), samples.len(), "questions are distinct");
}

#[test]
fn committed_data_matches_generator() {
    let dir = scratch_dir("regen");
    generate_multihop(COMMITTED_MULTIHOP_SEED, MultihopSizes::committed())
        .expect("valid sizes")
        .write(&dir)
        .expect("write");
    for f in ["corpus.jsonl", "train.jsonl", "test.jsonl", "manifest.json"] {
        let fresh = std::fs::read(dir.join(f)).expect("generated");
        let kept = std::fs::read(data_dir().join(f)).expect("committed");
        assert!(fresh == kept, "data/multihop/{f} differs from generate_multihop(COMMITTED_MULTIHOP_SEED, committed sizes); regenerate it");
    }
    let _ = std::fs::remove_dir_all(&dir);
    let other = generate_multihop(7, MultihopSizes::committed()).expect("valid");
    let again = generate_multihop(7, MultihopSizes::committed()).expect("valid");
    assert_eq!(other.train, again.train);
    assert!(
        generate_multihop(8, MultihopSizes::committed())
            .expect("valid")
            .train
            != other.train
    );
    let zero = MultihopSizes {
        towns: 0,
        ..MultihopSizes::committed()
    };
    assert!(generate_multihop(1, zero).is_err());
}

#[test]
fn bm25_top3_rate_on_one_hop_questions() {
    let (corpus, samples) = committed();
    let retriever = Bm25Retriever::new(corpus, Bm25Params::default());
    // Share of `hops`-hop questions whose gold document number `which`
    // is in the top 3 when searching the question text itself.
    let rate = |hops: u32, which: usize| {
        let qs: Vec<&QaSample> = samples.iter().filter(|s| s.hops == Some(hops)).collect();
        let found = qs
            .iter()
            .filter(|s| {
                let hits = retriever.search(&s.question, DEFAULT_TOP_K);
                hits.iter().any(|(d, _)| d.id == s.gold_doc_ids[which])
            })
            .count();
        (found as f64 / qs.len() as f64, qs.len())
    };
    let (one, n1) = rate(1, 0);
    let (first, n2) = rate(2, 0);
    let (second, _) = rate(2, 1);
    println!(
        "BM25 top-3: gold doc found for {:.1}% of {n1} 1-hop questions",
        one * 100.0
    );
    println!("BM25 top-3 on {n2} 2-hop questions: first-hop doc {:.1}%, second-hop doc {:.1}% (needs the bridge entity)", first * 100.0, second * 100.0);
    assert!(one >= 0.95, "1-hop top-3 rate {one}");
    // The data's point: the question alone must not find the answer's document.
    assert!(
        second <= 0.2,
        "2-hop questions are answerable in one search: {second}"
    );
}

#[tokio::test]
async fn scripted_two_hop_episode() {
    let (corpus, samples) = committed();
    let s = samples
        .iter()
        .find(|s| s.hops == Some(2))
        .expect("a 2-hop question")
        .clone();
    let bridge = corpus
        .get(&s.gold_doc_ids[1])
        .expect("bridge doc")
        .title
        .clone();
    let first = corpus
        .get(&s.gold_doc_ids[0])
        .expect("first doc")
        .title
        .clone();
    let env = SearchQaEnv::with_bm25(corpus, DEFAULT_TOP_K, EnvConfig::default()).expect("env");
    assert_eq!(env.stop_strings(), ["</search>", "</answer>"]);
    let mut ep = env.start(&s).unwrap();
    assert_eq!(ep.prompt().len(), 2);
    assert!(ep.prompt()[0].content.contains("<search> query </search>"));
    assert_eq!(ep.prompt()[1].content, format!("Question: {}", s.question));

    let o1 = env
        .step(
            &mut ep,
            &format!("<think>Find {first}.</think><search>{first}</search>"),
        )
        .await
        .expect("step");
    let obs = o1.observation.expect("search result");
    assert!(
        obs.starts_with("\n\n<information>Doc 1(Title: ") && obs.ends_with("</information>\n\n"),
        "{obs}"
    );
    assert!(
        obs.contains(&bridge),
        "the first document names the bridge entity"
    );
    let o2 = env
        .step(
            &mut ep,
            &format!("<think>Now {bridge}.</think><search>{bridge}</search>"),
        )
        .await
        .expect("step");
    assert!(o2
        .observation
        .expect("result")
        .contains(s.golden_answers[0].as_str()));
    let o3 = env
        .step(
            &mut ep,
            &format!(
                "<think>Done.</think><answer>{}</answer>",
                s.golden_answers[0]
            ),
        )
        .await
        .expect("step");
    assert!(o3.done && o3.observation.is_none());
    let score = env.score(&ep);
    assert_eq!(score.reward, 1.0, "{:?}", score.details);
    assert!(matches!(
        env.step(&mut ep, "<answer>x</answer>").await,
        Err(EnvError::EpisodeFinished(_))
    ));
}
