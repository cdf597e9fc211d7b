//! Sharding (`qdrift eval --shard I/N`, `qdrift merge`): the merged report of every shard's part
//! is byte-identical to the unsharded run's, in both KL modes and with a short last batch; parts
//! that do not make one run are refused.

use qdrift_eval::{EvalConfig, Evaluated, Part, Shard, evaluate, evaluate_any, merge};
use qdrift_report::Report;
use qdrift_tests::stories_eval;

fn config() -> EvalConfig {
    // 7 prompts in batches of 2: four batches, the last one short.
    stories_eval(7, 2, &["int8", "int4-g32"])
}

fn json(r: &Report) -> String {
    serde_json::to_string_pretty(r).expect("serializes")
}

/// Runs every shard of `count`, writes and reads back each part, merges them in reverse order.
fn parts(cfg: &EvalConfig, count: usize, dir: &std::path::Path) -> Vec<Part> {
    let mut parts = Vec::new();
    for index in (0..count).rev() {
        let mut shard_cfg = cfg.clone();
        shard_cfg.shard = Some(Shard { index, count });
        let Evaluated::Part(part) = evaluate_any(&shard_cfg, &mut |_| {}).expect("shard runs") else {
            panic!("a shard gives a part")
        };
        let part_dir = dir.join(format!("part-{index}"));
        std::fs::create_dir_all(&part_dir).expect("part folder");
        part.write(&part_dir).expect("part written");
        parts.push(Part::read(&part_dir).expect("part read back"));
    }
    parts
}

fn merged_equals_unsharded(top_k: Option<usize>, count: usize) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let mut cfg = config();
    cfg.reference_top_k = top_k;
    let whole = evaluate(&cfg, &mut |_| {}).expect("unsharded run");
    let merged = merge(parts(&cfg, count, tmp.path())).expect("merge");
    let (a, b) = (json(&merged), json(&whole));
    if let Some((i, (x, y))) = a.lines().zip(b.lines()).enumerate().find(|(_, (x, y))| x != y) {
        panic!("{count} shards, top-K {top_k:?}: line {i} of the merged report is {x:?}, unsharded {y:?}");
    }
    assert_eq!(a, b, "{count} shards, top-K {top_k:?}: the merged report is the unsharded one");
}

#[test]
fn merged_shards_give_the_unsharded_report_exact_kl() {
    merged_equals_unsharded(None, 3);
}

#[test]
fn merged_shards_give_the_unsharded_report_top_k() {
    merged_equals_unsharded(Some(16), 2);
}

/// Shards that read a reference saved by the unsharded run (each takes its prompts' part of the
/// store: no reference generation, no noise floor) merge into the same report.
#[test]
fn shards_reading_a_saved_reference_merge_into_the_unsharded_report() {
    for top_k in [None, Some(16)] {
        let tmp = tempfile::tempdir().expect("temp dir");
        let mut cfg = config();
        cfg.reference_top_k = top_k;
        cfg.save_reference = Some(tmp.path().join("store"));
        let whole = evaluate(&cfg, &mut |_| {}).expect("unsharded run saving the reference");
        cfg.save_reference = None;
        cfg.reference_store = Some(tmp.path().join("store"));
        let merged = merge(parts(&cfg, 3, tmp.path())).expect("merge");
        assert_eq!(json(&merged), json(&whole), "top-K {top_k:?}: shards from a store");
    }
}

#[test]
fn parts_of_different_runs_are_refused() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let cfg = config();
    let merge_err = |parts: Vec<Part>| merge(parts).map(|_| ()).expect_err("refused").to_string();
    let mut p = parts(&cfg, 2, &tmp.path().join("a"));
    p.pop();
    let e = merge_err(p);
    assert!(e.contains("shard 1/2 is missing") || e.contains("shard 0/2 is missing"), "{e}");

    let mut other = cfg.clone();
    other.seed = 7;
    let mut mixed = parts(&cfg, 2, &tmp.path().join("b"));
    let foreign = parts(&other, 2, &tmp.path().join("c"));
    mixed.truncate(1);
    mixed.extend(foreign.into_iter().skip(1));
    let e = merge_err(mixed);
    assert!(e.contains("another run"), "{e}");

    let mut twice = parts(&cfg, 2, &tmp.path().join("d"));
    let again = Part::read(&tmp.path().join("d/part-0")).expect("reads");
    twice.push(again);
    assert!(merge_err(twice).contains("twice"));

    // Four batches cannot make five shards; a damaged part is refused by its checksum.
    let mut five = cfg.clone();
    five.shard = Some(Shard { index: 4, count: 5 });
    let e = evaluate_any(&five, &mut |_| {}).map(|_| ()).expect_err("refused").to_string();
    assert!(e.contains("--shard") && e.contains("4 batches"), "{e}");
    let data = tmp.path().join("d/part-1/traces.bin");
    let mut bytes = std::fs::read(&data).expect("reads");
    bytes[10] ^= 0x40;
    std::fs::write(&data, bytes).expect("writes");
    let e = Part::read(&tmp.path().join("d/part-1")).map(|_| ()).expect_err("refused").to_string();
    assert!(e.contains("checksum"), "{e}");
}
