//! `qdrift compare` end to end on stories260K: two variants of one report, and two runs sharing a
//! saved reference; the numbers recomputed from the reports' per-prompt values; the verdicts'
//! exit codes; reports that are not paired refused naming the field.

mod common;

use std::path::Path;

use common::{qdrift, stories};
use serde_json::Value;

/// `qdrift eval` of stories260K on the CPU into `out` with `extra` arguments.
fn eval(out: &Path, extra: &[&str]) {
    let model = stories().join("stories260K.bin");
    let mut args = vec!["eval", "--model", model.to_str().expect("utf-8"), "--backend", "cpu", "--out"];
    args.push(out.to_str().expect("utf-8"));
    args.extend_from_slice(&["--prompts", "12", "--horizons", "10,50", "--resamples", "400"]);
    args.extend_from_slice(extra);
    let o = qdrift(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("written")).expect("JSON")
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// `qdrift compare` with `args`: exit code, stdout, stderr.
fn compare(args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["compare"];
    all.extend_from_slice(args);
    let o = qdrift(&all);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (o.status.code().expect("exit code"), text(&o.stdout), text(&o.stderr))
}

/// The variant named `name` of a report.
fn variant<'a>(report: &'a Value, name: &str) -> &'a Value {
    common::variant(report, name)
}

#[test]
fn compare_pairs_prompts_and_gates_on_the_interval() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (one, store, two, out) =
        (dir.path().join("one"), dir.path().join("store"), dir.path().join("two"), dir.path().join("cmp"));
    eval(&one, &["--schemes", "int8,int4-g32", "--save-reference", store.to_str().expect("utf-8")]);
    let report = one.join("report.json");
    let r = report.to_str().expect("utf-8");

    // Two variants of one report: int8 (A) against int4-g32 (B), written out.
    let (code, stdout, stderr) =
        compare(&[r, r, "--variant-a", "int8", "--variant-b", "int4-g32", "--out", out.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("# qdrift compare: int8 vs int4-g32") && stdout.contains("| `kld` |"), "{stdout}");
    let c = json(&out.join("compare.json"));
    assert!(std::fs::read_to_string(out.join("compare.html")).expect("html").contains("<table"));
    assert_eq!((c["format"].as_str(), c["prompts"].as_u64()), (Some("qdrift-comparison"), Some(12)));
    assert_eq!(c["a"]["report"], "one/report.json");

    // Every number against the report's own per-prompt values and estimates.
    let rep = json(&report);
    let (va, vb) = (variant(&rep, "int8"), variant(&rep, "int4-g32"));
    let mut checked = 0;
    for (hi, h) in c["horizons"].as_array().expect("horizons").iter().enumerate() {
        for m in h["metrics"].as_array().expect("metrics") {
            let name = m["name"].as_str().expect("name");
            let (ea, eb) = (f(&va["horizons"][hi][name]["mean"]), f(&vb["horizons"][hi][name]["mean"]));
            assert!((f(&m["a"]) - ea).abs() <= 1e-9 * ea.abs().max(1.0), "{name}: A {} vs {ea}", m["a"]);
            assert!((f(&m["b"]) - eb).abs() <= 1e-9 * eb.abs().max(1.0), "{name}: B {} vs {eb}", m["b"]);
            assert!((f(&m["difference"]["mean"]) - (eb - ea)).abs() <= 1e-9 * (eb - ea).abs().max(1.0));
            let d = &m["difference"]["ci95"];
            assert!(f(&d[0]) <= f(&m["difference"]["mean"]) && f(&m["difference"]["mean"]) <= f(&d[1]));
            // The sign test's counts for a metric that is a plain mean: lower is better for the KLD.
            if name == "kld" || name == "token_match_rate" {
                let (pa, pb) = (&va["horizons"][hi]["per_prompt"][name], &vb["horizons"][hi]["per_prompt"][name]);
                let signs: Vec<f64> = (0..12).map(|i| f(&pb[i]) - f(&pa[i])).collect();
                let (up, down) =
                    (signs.iter().filter(|&&s| s > 0.0).count(), signs.iter().filter(|&&s| s < 0.0).count());
                let (b_closer, a_closer) = if name == "kld" { (down, up) } else { (up, down) };
                assert_eq!(m["sign_test"]["b_closer"].as_u64(), Some(b_closer as u64), "{name}");
                assert_eq!(m["sign_test"]["a_closer"].as_u64(), Some(a_closer as u64), "{name}");
                // Two-sided exact binomial p-value, by hand.
                let n = b_closer + a_closer;
                let k = b_closer.min(a_closer);
                let choose = |n: usize, k: usize| (0..k).fold(1.0, |c, i| c * (n - i) as f64 / (i + 1) as f64);
                let tail: f64 = (0..=k).map(|j| choose(n, j)).sum::<f64>() / 2f64.powi(n as i32);
                let p = (2.0 * tail).min(1.0);
                assert!(
                    (f(&m["sign_test"]["p_value"]) - p).abs() < 1e-12,
                    "{name}: p {} vs {p}",
                    m["sign_test"]["p_value"]
                );
            }
            checked += 1;
        }
    }
    // 24 metrics have per-prompt values on a dense model (28 less the 4 routing ones).
    assert_eq!(checked, 2 * 24, "metric-horizons compared");
    let kld =
        &c["horizons"][1]["metrics"].as_array().expect("metrics").iter().find(|m| m["name"] == "kld").expect("kld");
    assert_eq!(kld["closer"], "a", "int8 is closer to the reference than int4-g32 on the KLD: {kld}");

    // The gate: B is worse on the KLD by its whole interval.
    let worse = (-f(&kld["b_advantage"]["ci95"][1]), -f(&kld["b_advantage"]["ci95"][0]));
    let check = |x: f64| {
        compare(&[r, r, "--variant-a", "int8", "--variant-b", "int4-g32", "--max-worse", &format!("kld@50={x}")])
    };
    let (code, stdout, _) = check(worse.0 / 2.0);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("FAIL kld@50"), "{stdout}");
    assert_eq!(check(worse.1 * 2.0).0, 0);
    let (code, stdout, _) = check((worse.0 + worse.1) / 2.0);
    assert_eq!(code, 3, "{stdout}");
    assert!(stdout.contains("INCONCLUSIVE kld@50"), "{stdout}");

    // Two runs sharing the saved reference pair as one run's variants do.
    eval(&two, &["--schemes", "int4-g32", "--reference", store.to_str().expect("utf-8")]);
    let out2 = dir.path().join("cmp2");
    let (code, _, stderr) = compare(&[
        r,
        two.join("report.json").to_str().expect("utf-8"),
        "--variant-a",
        "int8",
        "--out",
        out2.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let c2 = json(&out2.join("compare.json"));
    assert_eq!(c2["horizons"], c["horizons"], "the same numbers from two runs with a saved reference");
}

#[test]
fn reports_that_are_not_paired_are_refused_by_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b, c) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("c"));
    eval(&a, &["--schemes", "int8"]);
    eval(&b, &["--schemes", "int8", "--seed", "7"]);
    let path = |d: &Path| d.join("report.json").to_str().expect("utf-8").to_string();
    let (code, _, stderr) = compare(&[&path(&a), &path(&b)]);
    assert_eq!(code, 2);
    assert!(stderr.contains("not paired: workload.seed is"), "{stderr}");
    assert!(!stderr.contains("panicked"));
    // A report without per-prompt values (written before they were added) is refused, saying so.
    let mut old = json(&a.join("report.json"));
    for v in old["variants"].as_array_mut().expect("variants") {
        for h in v["horizons"].as_array_mut().expect("horizons") {
            h.as_object_mut().expect("object").remove("per_prompt");
        }
    }
    std::fs::create_dir_all(&c).expect("dir");
    std::fs::write(c.join("report.json"), serde_json::to_string(&old).expect("JSON")).expect("written");
    let (code, _, stderr) = compare(&[&path(&a), &path(&c)]);
    assert_eq!(code, 2);
    assert!(stderr.contains("no per-prompt values") && stderr.contains("evaluate it again"), "{stderr}");
    // Two variants where one is named and the report has several.
    let (code, _, stderr) = compare(&[&path(&a), &path(&a), "--variant-b", "nope"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("no variant is named \"nope\""), "{stderr}");
    let (code, _, stderr) = compare(&[&path(&a), &path(&a), "--max-worse", "kld_p99@10=0.1"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("not a metric compare pairs"), "{stderr}");
}

/// The committed stories260K report (exact KL), read by the tests that need no evaluation.
fn committed() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../reports/stories260K/report.json")
}

#[test]
fn an_exact_report_and_a_top_k_one_are_not_paired() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut report = json(&committed());
    report["reference"]["kl"] =
        serde_json::json!({"method": "top_k_tail", "top_k": 64, "tail_mass_max": 0.03, "tail_mass_mean": 0.004});
    let top_k = dir.path().join("report.json");
    std::fs::write(&top_k, serde_json::to_string(&report).expect("JSON")).expect("written");
    let exact = committed();
    let (code, stdout, stderr) = compare(&[
        exact.to_str().expect("utf-8"),
        top_k.to_str().expect("utf-8"),
        "--variant-a",
        "int8",
        "--variant-b",
        "int4-g128",
    ]);
    assert_eq!(code, 2, "{stdout}");
    assert_eq!(
        stderr,
        "qdrift: error: cannot compare: the reports are not paired: their KL divergences are not the same \
         measurement (reference.kl): A's are exact (over the full vocabulary), B's against the reference's top-64 \
         log-probabilities plus a tail bucket (--reference-top-k 64): a lower bound\n"
    );
}

#[test]
fn an_out_that_is_a_file_is_refused_naming_it_and_what_to_do() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("compared");
    std::fs::write(&file, "mine").expect("written");
    let r = committed();
    let r = r.to_str().expect("utf-8");
    for out in [file.clone(), file.join("inside")] {
        let args = [r, r, "--variant-a", "int8", "--variant-b", "int4-g128", "--out", out.to_str().expect("utf-8")];
        let (code, stdout, stderr) = compare(&args);
        assert_eq!(code, 2, "{stdout}");
        assert!(stdout.is_empty(), "nothing is computed: {stdout}");
        assert_eq!(
            stderr,
            format!(
                "qdrift: error: --out {}: {} exists and is not a folder; compare writes compare.json, compare.md, \
                 compare.html into a folder: remove it or choose another --out\n",
                out.display(),
                file.display()
            )
        );
    }
    assert_eq!(std::fs::read_to_string(&file).expect("kept"), "mine");
}
