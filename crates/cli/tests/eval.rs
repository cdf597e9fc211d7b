//! `qdrift eval` end to end on stories260K (CPU backend): the identity test, an independent
//! recomputation of the metrics from dumped log-probabilities, and bad input.

use std::path::Path;

use serde_json::Value;

mod common;
use common::{qdrift, stories, variant};

fn run_eval(out: &Path, extra: &[&str]) -> Value {
    let dir = stories();
    let model = dir.join("stories260K.bin");
    let mut args = vec!["eval", "--model", model.to_str().expect("utf-8"), "--backend", "cpu"];
    args.extend_from_slice(&["--out", out.to_str().expect("utf-8")]);
    args.extend_from_slice(extra);
    let o = qdrift(&args);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "qdrift eval failed: {stderr}");
    // stderr is a pipe here, as in a CI log: progress comes as plain lines.
    assert!(stderr.contains(": generating ") && stderr.contains(": 100% ("), "{stderr}");
    assert!(stderr.contains(": scoring\n") && stderr.contains(": done\n"), "{stderr}");
    let text = std::fs::read_to_string(out.join("report.json")).expect("report.json written");
    serde_json::from_str(&text).expect("report.json is JSON")
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The `fp16` scheme on the FP16 reference is the reference: every divergence is exactly zero,
/// whatever the batch composition.
#[test]
fn fp16_scheme_is_identical_to_the_reference() {
    let out = tempfile::tempdir().expect("tempdir");
    let report = run_eval(
        out.path(),
        &["--schemes", "fp16", "--prompts", "6", "--batch-size", "4", "--horizons", "10,40", "--resamples", "200"],
    );
    assert_eq!(report["schema_version"], 2);
    let v = variant(&report, "fp16");
    assert_eq!(v["kind"], "scheme");
    assert_eq!(v["recipe"], serde_json::json!({"weights": "fp16", "activations": null, "kv_cache": null}));
    for h in v["horizons"].as_array().expect("horizons") {
        assert_eq!(f(&h["token_match_rate"]["mean"]), 1.0, "{h}");
        assert_eq!(f(&h["exact_match_fraction"]["mean"]), 1.0);
        assert_eq!(f(&h["kld"]["mean"]), 0.0);
        assert_eq!(f(&h["kld"]["max"]), 0.0);
        assert_eq!(f(&h["top1_agreement"]["mean"]), 1.0);
        assert_eq!(f(&h["rms_delta_p"]["mean"]), 0.0);
        assert_eq!(f(&h["ppl_ratio_on_reference_text"]["mean"]), 1.0);
        assert_eq!(f(&h["ppl_drift_of_generated_text"]["mean"]), 1.0);
        assert_eq!(h["token_match_rate"]["ci95"], serde_json::json!([1.0, 1.0]));
    }
    assert_eq!(v["first_divergence"]["censored"], 6);
    assert!(v["first_divergence"]["median"].is_null());
    // The noise floor is reported, first.
    assert_eq!(report["variants"][0]["kind"], "noise_floor");
    assert_eq!(report["variants"][0]["name"], "noise-floor-f32");
}

/// Activation and KV-cache variants run through eval: each records its parts separately, the
/// report groups variants by what they quantize, and run-time rounding on top of the same
/// weights moves the numbers (the weight-only twin is run beside it).
#[test]
fn activation_and_kv_variants_record_their_parts_and_diverge() {
    let out = tempfile::tempdir().expect("tempdir");
    let schemes = "int4-g128,w8a8-int8,int4-g128+kv-q8_0,fp16+kv-fp8-e4m3-head,fp8-e4m3+a-fp8-e5m2-tensor";
    let report =
        run_eval(out.path(), &["--schemes", schemes, "--prompts", "4", "--horizons", "20", "--resamples", "200"]);
    let parts = |name: &str| variant(&report, name)["recipe"].clone();
    use serde_json::json;
    assert_eq!(parts("w8a8-int8"), json!({"weights": "int8", "activations": "int8", "kv_cache": null}));
    assert_eq!(parts("int4-g128+kv-q8_0"), json!({"weights": "int4-g128", "activations": null, "kv_cache": "q8_0"}));
    assert_eq!(
        parts("fp16+kv-fp8-e4m3-head"),
        json!({"weights": "fp16", "activations": null, "kv_cache": "fp8-e4m3-head"})
    );
    assert_eq!(parts("fp8-e4m3+a-fp8-e5m2-tensor")["activations"], "fp8-e5m2-tensor");
    let kld = |name: &str| f(&variant(&report, name)["horizons"][0]["kld"]["mean"]);
    // Only the cache is rounded: it diverges from the reference, though the weights are its own.
    assert!(kld("fp16+kv-fp8-e4m3-head") > 0.0);
    assert_ne!(kld("int4-g128+kv-q8_0"), kld("int4-g128"));
    let md = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    for row in [
        "| int4-g128 | weights | scheme | int4-g128 | — | — |",
        "| w8a8-int8 | weights + activations | scheme | int8 | int8 | — |",
        "| fp16+kv-fp8-e4m3-head | KV cache | scheme | fp16 | — | fp8-e4m3-head |",
    ] {
        assert!(md.contains(row), "report.md lacks {row}");
    }
    // Grouped in the tables after the verdict (which ranks): weight-only rows come before
    // activation rows, which come before KV-cache rows.
    let variants = &md[md.find("## Variants").expect("a variants section")..];
    let at = |s: &str| variants.find(&format!("| {s} |")).unwrap_or_else(|| panic!("{s} in report.md"));
    assert!(at("int4-g128") < at("w8a8-int8") && at("w8a8-int8") < at("int4-g128+kv-q8\\_0"));
    let html = std::fs::read_to_string(out.path().join("report.html")).expect("report.html");
    assert!(html.contains("weights + KV cache"));
}

/// Bad variant strings get one line that says what is wrong and lists the valid parts; a ggml
/// KV-cache format on a model whose cache rows are not whole blocks is refused before anything
/// runs, as is a quantize of a run-time part.
#[test]
fn bad_variants_are_refused_with_the_grammar() {
    let model = stories().join("stories260K.bin");
    let model = model.to_str().expect("utf-8");
    for (scheme, says) in [
        ("int4-g128+kv-q3", "unknown KV-cache format `q3`"),
        ("int8+a-int8+a-fp8", "more than one activation part"),
        ("w8a8-int4", "unknown weight scheme `w8a8-int4`"),
    ] {
        let out = tempfile::tempdir().expect("tempdir");
        let o = qdrift(&["eval", "--model", model, "--schemes", scheme, "--out", out.path().to_str().expect("utf-8")]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{scheme}: {stderr}");
        assert!(
            stderr.contains(says) && stderr.contains("WEIGHTS[+a-ACT][+kv-KV]") && stderr.contains("q4_0"),
            "{stderr}"
        );
        let o = qdrift(&["generate", "--model", model, "--scheme", scheme, "--prompt", "Once"]);
        assert!(String::from_utf8_lossy(&o.stderr).contains(says), "generate --scheme {scheme}");
    }
    // synthetic:tiny caches 2 KV heads × 8 = 16 values per token: not a q8_0 block.
    let out = tempfile::tempdir().expect("tempdir");
    let o = qdrift(&[
        "eval",
        "--model",
        "synthetic:tiny",
        "--schemes",
        "fp16+kv-q8_0",
        "--backend",
        "cpu",
        "--out",
        out.path().to_str().expect("utf-8"),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    // The line that says what runs, then the one error line.
    assert!(stderr.contains("q8_0") && stderr.contains("16 values") && stderr.lines().count() == 2, "{stderr}");
    assert!(stderr.lines().nth(1).is_some_and(|l| l.starts_with("qdrift: error: ")), "{stderr}");
    assert!(!out.path().join("report.json").exists());
    let o = qdrift(&[
        "quantize",
        "--model",
        model,
        "--scheme",
        "w8a8-int8",
        "--out",
        out.path().join("q.safetensors").to_str().expect("utf-8"),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && stderr.contains("--scheme int8"), "{stderr}");
}

/// KLD, top-1 agreement and the PPL ratio on the reference text, and the reverse KL, acceptance
/// and top-K agreement metrics, recomputed from the dumped full-vocabulary log-probabilities by the
/// textbook formulas, agree with the report within 1e-6.
#[test]
fn report_metrics_match_an_independent_recomputation() {
    let out = tempfile::tempdir().expect("tempdir");
    let dump = out.path().join("logprobs.jsonl");
    let horizons = [5usize, 20];
    let report = run_eval(
        out.path(),
        &[
            "--schemes",
            "int4-g32,fp8-e4m3",
            "--prompts",
            "5",
            "--batch-size",
            "3",
            "--horizons",
            "5,20",
            "--resamples",
            "100",
            "--dtype",
            "f32",
            "--dump-logprobs",
            dump.to_str().expect("utf-8"),
        ],
    );
    let rows = textbook(&dump);
    let mut checked = 0;
    for name in ["noise-floor-f16", "int4-g32", "fp8-e4m3"] {
        let v = variant(&report, name);
        for (hi, &h) in horizons.iter().enumerate() {
            let m = &v["horizons"][hi];
            assert_eq!(m["tokens"], h);
            let all: Vec<&Textbook> = (0..5)
                .flat_map(|p| (0..h).map(move |t| (p, t)))
                .map(|(p, t)| &rows[&(name.to_string(), p, t)])
                .collect();
            // Means over all positions (every prompt has h): the mean of prompts' means.
            let avg = |g: &dyn Fn(&Textbook) -> f64| all.iter().map(|x| g(x)).sum::<f64>() / all.len() as f64;
            let top1 = avg(&|x| f64::from(u8::from(x.top1_agree)));
            let ppl = (avg(&|x| x.logp_ref - x.logp_var)).exp();
            for (what, got, want) in [
                ("kld", f(&m["kld"]["mean"]), avg(&|x| x.kld.max(0.0))),
                ("top1", f(&m["top1_agreement"]["mean"]), top1),
                ("ppl", f(&m["ppl_ratio_on_reference_text"]["mean"]), ppl),
            ] {
                assert!((got - want).abs() <= 1e-6, "{name}@{h} {what}: report {got}, recomputed {want}");
                checked += 1;
            }
            assert!((avg(&|x| x.overlap[0]) - top1).abs() < 1e-12, "K = 1 overlap is the top-1 agreement");
            checked += check_agreement_metrics(m, &format!("{name}@{h}"), &all);
        }
    }
    assert_eq!(checked, 18 + 6 * 8);
}

/// One position of the dump, by the textbook formulas.
struct Textbook {
    kld: f64,
    top1_agree: bool,
    /// ln p_ref and ln p_var of the reference's token.
    logp_ref: f64,
    logp_var: f64,
    /// KL(P_var ‖ P_ref).
    reverse: f64,
    /// Σ min(p_ref, p_var).
    accept: f64,
    /// |top-K ∩ top-K| / K for K = 1..5.
    overlap: [f64; 5],
    /// The reference's top-1 among the variant's top 5.
    ref_top1_in_top5: bool,
}

/// Variant → prompt → position → its [`Textbook`] values, from a `--dump-logprobs` file.
fn textbook(dump: &Path) -> std::collections::BTreeMap<(String, usize, usize), Textbook> {
    let mut rows = std::collections::BTreeMap::new();
    let text = std::fs::read_to_string(dump).expect("dump written");
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).expect("dump line is JSON");
        let lr: Vec<f64> = v["ref_logprobs"].as_array().expect("ref").iter().map(f).collect();
        let lq: Vec<f64> = v["var_logprobs"].as_array().expect("var").iter().map(f).collect();
        let token = v["token"].as_u64().expect("token") as usize;
        let argmax = |x: &[f64]| x.iter().enumerate().fold(0, |best, (i, &y)| if y > x[best] { i } else { best });
        // The five most likely tokens, lower id first on ties (a stable sort).
        let top5 = |x: &[f64]| {
            let mut order: Vec<usize> = (0..x.len()).collect();
            order.sort_by(|&a, &b| x[b].total_cmp(&x[a]));
            order.truncate(5);
            order
        };
        let (tr, tq) = (top5(&lr), top5(&lq));
        let key = (
            v["variant"].as_str().expect("variant").to_string(),
            v["prompt"].as_u64().expect("p") as usize,
            v["position"].as_u64().expect("t") as usize,
        );
        let position = Textbook {
            kld: lr.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum(),
            top1_agree: argmax(&lr) == argmax(&lq),
            logp_ref: lr[token],
            logp_var: lq[token],
            reverse: lq.iter().zip(&lr).map(|(b, a)| b.exp() * (b - a)).sum(),
            accept: lr.iter().zip(&lq).map(|(a, b)| a.exp().min(b.exp())).sum(),
            overlap: std::array::from_fn(|k| {
                tr[..=k].iter().filter(|i| tq[..=k].contains(i)).count() as f64 / (k + 1) as f64
            }),
            ref_top1_in_top5: tq.contains(&tr[0]),
        };
        rows.insert(key, position);
    }
    rows
}

/// The reverse KL (mean and p99), acceptance, sampling tokens per step (γ = 4), top-K overlaps and
/// the reference's top-1 in the variant's top 5 of one horizon `m` against the textbook values of
/// its positions; the number of means checked.
fn check_agreement_metrics(m: &Value, at: &str, all: &[&Textbook]) -> usize {
    let avg = |g: &dyn Fn(&Textbook) -> f64| all.iter().map(|x| g(x)).sum::<f64>() / all.len() as f64;
    let alpha = avg(&|x| x.accept.min(1.0));
    let mut checks = vec![
        ("kld_reverse", avg(&|x| x.reverse.max(0.0))),
        ("spec_acceptance", alpha),
        ("ref_top1_in_var_top_k", avg(&|x| f64::from(u8::from(x.ref_top1_in_top5)))),
        // Leviathan et al. 2023, eq. 1.
        ("spec_sampling_tokens_per_step_g4", (1.0 - alpha.powi(5)) / (1.0 - alpha)),
    ];
    for (k, name) in
        [(2, "top_k_overlap_k2"), (3, "top_k_overlap_k3"), (4, "top_k_overlap_k4"), (5, "top_k_overlap_k5")]
    {
        checks.push((name, avg(&|x| x.overlap[k - 1])));
    }
    for (metric, want) in &checks {
        let got = f(&m[metric]["mean"]);
        assert!((got - want).abs() <= 1e-6, "{at} {metric}: report {got}, recomputed {want}");
    }
    let p99 = f(&m["kld_reverse"]["p99"]);
    let mut pooled: Vec<f64> = all.iter().map(|x| x.reverse.max(0.0)).collect();
    pooled.sort_by(f64::total_cmp);
    // Hyndman & Fan type 7.
    let q = (pooled.len() - 1) as f64 * 0.99;
    let lo = q.floor() as usize;
    let want = pooled[lo] + (q - lo as f64) * (pooled[(lo + 1).min(pooled.len() - 1)] - pooled[lo]);
    assert!((p99 - want).abs() <= 1e-6 * want.max(1e-3), "{at} reverse KLD p99: {p99} vs {want}");
    checks.len()
}

/// Same inputs and seed → byte-identical report.
#[test]
fn reports_are_deterministic() {
    let (a, b) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let args = ["--schemes", "int8", "--prompts", "3", "--horizons", "8", "--resamples", "50", "--seed", "9"];
    run_eval(a.path(), &args);
    run_eval(b.path(), &args);
    let read = |d: &Path| std::fs::read(d.join("report.json")).expect("report");
    assert_eq!(read(a.path()), read(b.path()));
}

fn assert_fails(args: &[&str], expected: &str) {
    let out = tempfile::tempdir().expect("tempdir");
    let dir = stories();
    let model = dir.join("stories260K.bin");
    let mut all = vec![
        "eval",
        "--model",
        model.to_str().expect("utf-8"),
        "--backend",
        "cpu",
        "--out",
        out.path().to_str().expect("utf-8"),
    ];
    all.extend_from_slice(args);
    let o = qdrift(&all);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "should fail: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains(expected), "{stderr:?} should mention {expected:?}");
    assert!(!out.path().join("report.json").exists(), "no report on failure");
}

#[test]
fn bad_eval_input_is_one_clear_error() {
    assert_fails(&["--schemes", "int3"], "unknown weight scheme `int3`");
    assert_fails(&["--eval-set", "/nonexistent/set.jsonl"], "/nonexistent/set.jsonl");
    assert_fails(&["--prompts", "1000", "--horizons", "5"], "has 72 prompts");
    assert_fails(&["--horizons", "0"], "horizon");
    assert_fails(
        &["--variant", "/nonexistent/model.bin", "--horizons", "5", "--prompts", "2"],
        "/nonexistent/model.bin",
    );
    // NAME=PATH: a name with no path, and a named checkpoint that is not there.
    assert_fails(&["--variant", "q8=", "--horizons", "5"], "q8=: no path after the name");
    assert_fails(&["--variant", "q8=/nonexistent/q8.gguf", "--horizons", "5"], "/nonexistent/q8.gguf");
    // The same name twice is refused, and the message says how to tell them apart.
    let model = stories().join("stories260K.bin");
    let twice = [format!("a={}", model.display()), format!("a={}", model.display())];
    assert_fails(&["--variant", &twice[0], "--variant", &twice[1], "--horizons", "5"], "--variant NAME=PATH");
}

/// Reports name the model, a checkpoint variant and an eval set file by their file names, never by
/// the path they were read from on this machine; the hashes identify the contents.
#[test]
fn reports_name_files_not_machine_paths() {
    let out = tempfile::tempdir().expect("tempdir");
    let set = out.path().join("my-set.jsonl");
    std::fs::write(&set, "{\"id\":\"a\",\"prompt\":\"Once upon a time\"}\n{\"id\":\"b\",\"prompt\":\"Lily\"}\n")
        .expect("write");
    let model = stories().join("stories260K.bin");
    let report = run_eval(
        out.path(),
        &[
            "--variant",
            model.to_str().expect("utf-8"),
            "--schemes",
            "int8",
            "--eval-set",
            set.to_str().expect("utf-8"),
            "--horizons",
            "4",
            "--resamples",
            "50",
        ],
    );
    assert_eq!(report["model"]["path"], "stories260K.bin");
    assert_eq!(report["model"]["sha256"].as_str().expect("sha256").len(), 64);
    assert_eq!(report["workload"]["eval_set"]["path"], "my-set.jsonl");
    let v = variant(&report, "stories260K");
    assert_eq!(v["kind"], "checkpoint");
    assert_eq!(v["path"], "stories260K.bin");
    let machine = out.path().to_str().expect("utf-8");
    for file in ["report.json", "report.md", "report.html"] {
        let text = std::fs::read_to_string(out.path().join(file)).expect("report written");
        assert!(!text.contains(machine) && !text.contains("/shared/models"), "{file} names a machine path");
    }
}

/// A synthetic model's report says so, in report.json and in the Markdown.
#[test]
fn synthetic_runs_are_marked() {
    let out = tempfile::tempdir().expect("tempdir");
    let o = qdrift(&[
        "eval",
        "--model",
        "synthetic:tiny",
        "--backend",
        "cpu",
        "--prompts",
        "3",
        "--horizons",
        "4",
        "--schemes",
        "int8",
        "--resamples",
        "50",
        "--out",
        out.path().to_str().expect("utf-8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("report.json")).expect("report")).expect("JSON");
    assert_eq!(report["model"]["synthetic"], true);
    assert_eq!(report["model"]["format"], "synthetic");
    let md = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    assert!(md.contains("synthetic weights"), "{md}");
    assert!(std::fs::read_to_string(out.path().join("report.html")).expect("report.html").contains("<svg"));
}

/// `qdrift eval --gate` and `qdrift gate` exit 0 on pass, 1 on fail, 2 on unusable input, 3 when
/// a check is inconclusive.
/// `eval --gate default`: the built-in profile at the run's horizons, named before the check
/// lines. A scheme that leaves the weights at FP16 is within its excess KLD; 3 prompts cannot
/// show that it ends its text where the reference does (a Wilson interval of 0 of 3 reaches
/// 0.56), so the run is inconclusive, exit 3, and says how many prompts would tell.
#[test]
fn eval_gates_with_the_default_profile() {
    let out = tempfile::tempdir().expect("tempdir");
    let model = stories().join("stories260K.bin");
    let o = qdrift(&[
        "eval",
        "--model",
        model.to_str().expect("utf-8"),
        "--backend",
        "cpu",
        "--prompts",
        "3",
        "--horizons",
        "2,5",
        "--schemes",
        "fp16",
        "--resamples",
        "50",
        "--out",
        out.path().to_str().expect("utf-8"),
        "--gate",
        "default",
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(3), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    let announce = stdout.find("\ngate: thresholds profile \"default\"").expect("the profile is named");
    let pass = stdout.find("\nPASS fp16 excess_kld@5 bound=ci").expect("excess KLD at the longest horizon");
    assert!(announce < pass, "{stdout}");
    assert!(stdout.contains("\nINCONCLUSIVE fp16 stop_missed@5 bound=ci"), "{stdout}");
    assert!(!stdout.contains("routing_flip_rate@5 bound"), "a dense model has no routing check: {stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("1. fp16  INCONCLUSIVE  ")), "{stdout}");
}

#[test]
fn gate_exit_codes_through_the_binary() {
    let out = tempfile::tempdir().expect("tempdir");
    let dir = out.path();
    let pass = dir.join("pass.toml");
    std::fs::write(&pass, "[variant.\"fp16\"]\n\"token_match_rate@5\" = { min = 1.0 }\n\"kld@5\" = { max = 0.0 }\n")
        .expect("write");
    let fail = dir.join("fail.toml");
    std::fs::write(&fail, "[defaults]\nbound = \"point\"\n[variant.\"*\"]\n\"top1_agreement@5\" = { min = 1.01 }\n")
        .expect("write");
    let junit = dir.join("gate.xml");
    let model = stories().join("stories260K.bin");
    let o = qdrift(&[
        "eval",
        "--model",
        model.to_str().expect("utf-8"),
        "--backend",
        "cpu",
        "--prompts",
        "3",
        "--horizons",
        "5",
        "--schemes",
        "fp16",
        "--resamples",
        "50",
        "--out",
        dir.to_str().expect("utf-8"),
        "--gate",
        pass.to_str().expect("utf-8"),
        "--junit",
        junit.to_str().expect("utf-8"),
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("PASS fp16 token_match_rate@5"), "{stdout}");
    // The summary ends with the report's verdict, the gate's word per variant in it.
    let verdict = stdout.find("\nverdict: ranked by Excess KLD over the first 5 tokens").expect("a verdict");
    assert!(stdout[verdict..].lines().any(|l| l.starts_with("1. fp16  PASS  ")), "{stdout}");
    assert!(std::fs::read_to_string(&junit).expect("junit").contains("<testsuite"));
    let report = dir.join("report.json");
    let gate = |t: &std::path::Path| {
        qdrift(&["gate", "--report", report.to_str().expect("utf-8"), "--thresholds", t.to_str().expect("utf-8")])
    };
    let o = gate(&fail);
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stdout));
    assert!(String::from_utf8_lossy(&o.stdout).contains("FAIL fp16 top1_agreement@5"));
    let o = gate(&dir.join("missing.toml"));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing.toml"));
    // A threshold inside the noise floor's KLD interval: inconclusive, exit 3, and the line
    // says how many prompts would tell.
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&report).expect("report")).expect("JSON");
    let floor = json["variants"].as_array().expect("variants").iter().find(|v| v["kind"] == "noise_floor");
    let [lo, hi] =
        [0, 1].map(|i| floor.expect("a noise floor")["horizons"][0]["kld"]["ci95"][i].as_f64().expect("bound"));
    assert!(lo < hi, "the noise floor's KLD interval [{lo}, {hi}] has a width");
    let straddled = dir.join("straddled.toml");
    std::fs::write(&straddled, format!("[variant.\"noise-floor-f32\"]\n\"kld@5\" = {{ max = {} }}\n", (lo + hi) / 2.0))
        .expect("write");
    let o = gate(&straddled);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(3), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.starts_with("INCONCLUSIVE noise-floor-f32 kld@5 bound=ci"), "{stdout}");
    assert!(stdout.contains(" prompts=3 prompts_needed="), "{stdout}");
    assert!(stdout.ends_with("1 inconclusive: INCONCLUSIVE\n"), "{stdout}");
    // Thresholds suggested from this report: it passes them, and the gate's summary says so.
    let suggested = dir.join("suggested.toml");
    let report_arg = report.to_str().expect("utf-8");
    let o =
        qdrift(&["thresholds", "suggest", report_arg, "--margin", "0.1", "--out", suggested.to_str().expect("utf-8")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&suggested).expect("suggested thresholds");
    assert!(text.contains("[variant.\"fp16\"]\n\"token_match_rate@5\" = { min = "), "{text}");
    let summary = dir.join("summary.md");
    let o = qdrift(&[
        "gate",
        "--report",
        report_arg,
        "--thresholds",
        suggested.to_str().expect("utf-8"),
        "--summary-md",
        summary.to_str().expect("utf-8"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
    let md = std::fs::read_to_string(&summary).expect("summary");
    assert!(md.contains("**Gate: PASS**") && md.contains("| fp16 | PASS | — |"), "{md}");
    // A bad margin is one line and exit 2 (unusable input); nothing is written.
    let o = qdrift(&[
        "thresholds",
        "suggest",
        report_arg,
        "--margin=-1",
        "--out",
        dir.join("bad.toml").to_str().expect("utf-8"),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!dir.join("bad.toml").exists());
}

/// `qdrift inspect` on a synthetic 8B shape needs no weights (it would need 32 GB) and counts
/// its parameters as the Llama-3-8B shape implies.
#[test]
fn inspect_llama_8b_shape_without_weights() {
    let o = qdrift(&["inspect", "--model", "synthetic:llama-8b", "--seq-len", "8192", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    // 128256·4096 embedding + head (untied) + 32 layers × (2·4096 + 4096² ·2 + 2·4096·1024 + 3·4096·14336) + 4096.
    let per_layer: u64 = 2 * 4096 + 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336;
    let total = 2 * 128_256 * 4096 + 32 * per_layer + 4096;
    assert_eq!(total, 8_030_261_248);
    assert_eq!(v["params"]["total"], total, "{v}");
    // f16 KV cache at 8192 positions: 2 · 32 layers · 8 kv heads · 128 · 2 bytes · 8192.
    assert_eq!(v["kv_cache"]["f16_bytes"], 2u64 * 32 * 8 * 128 * 2 * 8192);
    assert_eq!(v["synthetic"], true);
}

/// `--shard I/N` writes parts, `qdrift merge` makes the report from them (in any order), and that
/// report is byte-identical to the unsharded run's; `--save-reference` then `--reference` gives the
/// same report too, and a shard cannot be combined with a gate.
#[test]
fn shards_merge_into_the_unsharded_report_and_a_saved_reference_is_reused() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let common = [
        "--prompts",
        "5",
        "--horizons",
        "5,20",
        "--batch-size",
        "2",
        "--seed",
        "7",
        "--schemes",
        "int8",
        "--resamples",
        "100",
    ];
    let whole = tmp.path().join("whole");
    let store = tmp.path().join("reference");
    let mut save = common.to_vec();
    save.extend(["--save-reference", store.to_str().expect("utf-8")]);
    run_eval(&whole, &save);
    let mut parts = Vec::new();
    for i in 0..3 {
        let part = tmp.path().join(format!("part-{i}"));
        let dir = stories();
        let model = dir.join("stories260K.bin");
        let shard = format!("{i}/3");
        let mut args = vec!["eval", "--model", model.to_str().expect("utf-8"), "--backend", "cpu"];
        args.extend_from_slice(&common);
        args.extend_from_slice(&["--shard", &shard, "--out", part.to_str().expect("utf-8")]);
        let o = qdrift(&args);
        assert!(o.status.success(), "shard {shard}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(part.join("part.json").is_file() && !part.join("report.json").exists());
        parts.push(part);
    }
    let merged = tmp.path().join("merged");
    let mut args = vec!["merge"];
    let names: Vec<String> = parts.iter().rev().map(|p| p.to_string_lossy().into_owned()).collect();
    args.extend(names.iter().map(String::as_str));
    args.extend(["--out", merged.to_str().expect("utf-8")]);
    let o = qdrift(&args);
    assert!(o.status.success(), "merge: {}", String::from_utf8_lossy(&o.stderr));
    let read = |d: &Path| std::fs::read(d.join("report.json")).expect("report.json");
    assert_eq!(read(&merged), read(&whole), "merged report = unsharded report");

    let reused = tmp.path().join("reused");
    let mut again = common.to_vec();
    again.extend(["--reference", store.to_str().expect("utf-8")]);
    run_eval(&reused, &again);
    assert_eq!(read(&reused), read(&whole), "a saved reference gives the same report");
    store_settings_are_taken_unless_given(tmp.path(), &store, &read(&whole));

    // Gating only a checkpoint against the store: `--schemes` with no value runs no scheme.
    let int8 = tmp.path().join("q8_0.gguf");
    let o = qdrift(&[
        "quantize",
        "--model",
        stories().join("stories260K.bin").to_str().expect("utf-8"),
        "--scheme",
        "q8_0",
        "--format",
        "gguf",
        "--out",
        int8.to_str().expect("utf-8"),
    ]);
    assert!(o.status.success(), "quantize: {}", String::from_utf8_lossy(&o.stderr));
    let only = tmp.path().join("only");
    let mut variant_only: Vec<&str> = common.iter().copied().filter(|a| *a != "int8").collect();
    variant_only.extend(["--variant", int8.to_str().expect("utf-8"), "--reference", store.to_str().expect("utf-8")]);
    let report: Value = run_eval(&only, &variant_only);
    let names: Vec<&str> =
        report["variants"].as_array().expect("variants").iter().filter_map(|v| v["name"].as_str()).collect();
    assert_eq!(names.len(), 2, "the noise floor and the checkpoint only: {names:?}");
    // The checkpoint is identified by its bytes: the SHA-256 sha256sum gives.
    let sum = std::process::Command::new("sha256sum").arg(&int8).output().expect("sha256sum runs");
    let sum = String::from_utf8_lossy(&sum.stdout).split_whitespace().next().expect("a hash").to_string();
    assert_eq!(variant(&report, "q8_0")["sha256"], sum.as_str());
    // NAME=PATH names it.
    let named = tmp.path().join("named");
    let mut variant_named: Vec<&str> = common.iter().copied().filter(|a| *a != "int8").collect();
    let spec = format!("stories-q8={}", int8.display());
    variant_named.extend(["--variant", &spec, "--reference", store.to_str().expect("utf-8")]);
    let report: Value = run_eval(&named, &variant_named);
    assert_eq!(variant(&report, "stories-q8")["path"], "q8_0.gguf");
    assert_eq!(variant(&report, "stories-q8")["sha256"], sum.as_str());

    let thresholds = tmp.path().join("t.toml");
    std::fs::write(&thresholds, "").expect("writes");
    let dir = stories();
    let model = dir.join("stories260K.bin");
    let o = qdrift(&[
        "eval",
        "--model",
        model.to_str().expect("utf-8"),
        "--shard",
        "0/2",
        "--gate",
        thresholds.to_str().expect("utf-8"),
        "--out",
        tmp.path().join("x").to_str().expect("utf-8"),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && stderr.contains("--shard") && stderr.contains("--gate"), "{stderr}");
}

/// A run with `--reference STORE` that gives no prompts, horizons, batch size or seed takes the
/// store's (its report is `whole`, the saving run's); one that gives other values is refused with
/// every differing field.
fn store_settings_are_taken_unless_given(tmp: &Path, store: &Path, whole: &[u8]) {
    let read = |d: &Path| std::fs::read(d.join("report.json")).expect("report.json");
    // Prompts, horizons, batch size and seed not given are the store's.
    let short = tmp.join("short");
    run_eval(&short, &["--schemes", "int8", "--resamples", "100", "--reference", store.to_str().expect("utf-8")]);
    assert_eq!(read(&short), whole, "the store's settings give the same report");
    // A setting given that differs is refused with the store's other mismatches.
    let o = qdrift(&[
        "eval",
        "--model",
        stories().join("stories260K.bin").to_str().expect("utf-8"),
        "--backend",
        "cpu",
        "--horizons",
        "5,30",
        "--batch-size",
        "3",
        "--schemes",
        "int8",
        "--reference",
        store.to_str().expect("utf-8"),
        "--out",
        tmp.join("mismatch").to_str().expect("utf-8"),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    // The line that says what runs, then the one error line.
    assert!(!o.status.success() && stderr.lines().count() == 2, "{stderr}");
    assert!(
        stderr.contains("horizons [5,20] (this run: [5,30])") && stderr.contains("batch_size 2 (this run: 3)"),
        "{stderr}"
    );
}

/// The stopping metrics, recomputed from `qdrift generate`'s own greedy tokens for the reference
/// and the variant (each model's free-running text, generated apart from the evaluation): where
/// each first ends its story (BOS, for a llama2.c model), per horizon, then the two shares and the median length
/// ratio by their definitions. stories260K ends most stories within 200 tokens.
#[test]
fn stopping_metrics_match_the_models_own_generations() {
    let out = tempfile::tempdir().expect("tempdir");
    let prompts = 8;
    let report = run_eval(
        out.path(),
        &["--schemes", "int4-g32", "--prompts", "8", "--horizons", "40,200", "--resamples", "100", "--dtype", "f16"],
    );
    assert_eq!(report["model"]["stop_token_id"], 1, "llama2.c's models end a story with BOS");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let set = std::fs::read_to_string(root.join("eval-sets/stories.jsonl")).expect("stories set");
    let texts: Vec<String> = set
        .lines()
        .take(prompts)
        .map(|l| serde_json::from_str::<Value>(l).expect("JSONL")["prompt"].as_str().expect("prompt").to_string())
        .collect();
    let dir = stories();
    let generated = |scheme: Option<&str>| -> Vec<Vec<u64>> {
        let (model, tok) = (dir.join("stories260K.bin"), dir.join("tok512.bin"));
        let mut args = vec![
            "generate",
            "--model",
            model.to_str().expect("utf-8"),
            "--tokenizer",
            tok.to_str().expect("utf-8"),
            "--max-new-tokens",
            "200",
            "--dtype",
            "f16",
            "--backend",
            "cpu",
            "--json",
        ];
        if let Some(s) = scheme {
            args.extend(["--scheme", s]);
        }
        for t in &texts {
            args.extend(["--prompt", t.as_str()]);
        }
        let o = qdrift(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).expect("JSON line");
                v["generated_tokens"].as_array().expect("tokens").iter().map(|t| t.as_u64().expect("id")).collect()
            })
            .collect()
    };
    let (reference, int4) = (generated(None), generated(Some("int4-g32")));
    let v = variant(&report, "int4-g32");
    let mut stopped = 0;
    for (hi, h) in [40usize, 200].into_iter().enumerate() {
        let first = |tokens: &[u64]| tokens[..h].iter().position(|&t| t == 1);
        let stops: Vec<(Option<usize>, Option<usize>)> =
            reference.iter().zip(&int4).map(|(r, q)| (first(r), first(q))).collect();
        stopped += stops.iter().filter(|(r, _)| r.is_some()).count();
        let alike = stops.iter().filter(|(r, q)| r == q).count() as f64 / prompts as f64;
        let missed = stops.iter().filter(|(r, q)| r.is_some() && q.is_none()).count() as f64 / prompts as f64;
        let m = &v["horizons"][hi];
        assert_eq!(f(&m["stop_agreement"]["mean"]), alike, "@{h}");
        assert_eq!(f(&m["stop_missed"]["mean"]), missed, "@{h}");
        let mut ratios: Vec<f64> =
            stops.iter().filter_map(|&(r, q)| r.map(|r| (q.unwrap_or(h) + 1) as f64 / (r + 1) as f64)).collect();
        if ratios.is_empty() {
            assert!(m.get("stop_length_ratio").is_none(), "@{h}");
            continue;
        }
        ratios.sort_by(f64::total_cmp);
        let n = ratios.len();
        let median = if n % 2 == 1 { ratios[n / 2] } else { (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0 };
        assert!((f(&m["stop_length_ratio"]["mean"]) - median).abs() < 1e-12, "@{h}: {median}");
    }
    assert!(stopped > 0, "some story ends within 200 tokens, or the test checks nothing");
}

/// `--prompts auto`: a check inconclusive at one batch of prompts gets another round with more,
/// until it resolves; the report is byte for byte the one `--prompts P` writes for the last
/// round's P. Without what it needs, or with what it cannot combine with, it is refused in one
/// line before anything runs.
#[test]
fn prompts_auto_adds_rounds_until_the_gate_resolves() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let thresholds = tmp.path().join("thresholds.toml");
    // int8's KLD over 10 tokens is about 3.8e-4: at 4 prompts its interval reaches past 4.5e-4,
    // at 8 it does not.
    std::fs::write(&thresholds, "[variant.int8]\n\"kld@10\" = { max = 4.5e-4 }\n").expect("write");
    let model = stories().join("stories260K.bin");
    let common = |out: &Path, prompts: &[&str]| -> std::process::Output {
        let mut args = vec![
            "eval",
            "--model",
            model.to_str().expect("utf-8"),
            "--schemes",
            "int8",
            "--horizons",
            "10",
            "--batch-size",
            "4",
            "--resamples",
            "200",
            "--backend",
            "cpu",
            "--gate",
            thresholds.to_str().expect("utf-8"),
            "--out",
            out.to_str().expect("utf-8"),
        ];
        args.extend_from_slice(prompts);
        qdrift(&args)
    };
    let auto = tmp.path().join("auto");
    let o = common(&auto, &["--prompts", "auto", "--max-prompts", "32"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("--prompts auto: a round of 4 prompts (at most 32)"), "{stderr}");
    assert!(stderr.contains("1 of 1 checks inconclusive at 4 prompts; next round 8"), "{stderr}");
    assert!(stderr.contains("every check resolved at 8 prompts"), "{stderr}");
    let fixed = tmp.path().join("fixed");
    let o = common(&fixed, &["--prompts", "8"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    for file in ["report.json", "report.md", "report.html"] {
        let (a, b) = (std::fs::read(auto.join(file)).expect("auto"), std::fs::read(fixed.join(file)).expect("fixed"));
        assert!(a == b, "{file} of --prompts auto differs from --prompts 8's");
    }
    // Refused in one line, exit 1, nothing written.
    let refused = tmp.path().join("refused");
    for (extra, message) in [
        (&["--prompts", "auto"][..], "--prompts auto needs --max-prompts N"),
        (&["--prompts", "8", "--max-prompts", "16"][..], "--max-prompts is for --prompts auto"),
        (&["--prompts", "auto", "--max-prompts", "16", "--shard", "0/2"][..], "cannot be combined with --shard"),
        (&["--prompts", "0"][..], "is not a positive prompt count or `auto`"),
    ] {
        let o = common(&refused, extra);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && stderr.contains(message), "{extra:?}: {stderr}");
        assert!(!refused.join("report.json").exists());
    }
    let o = qdrift(&[
        "eval",
        "--model",
        model.to_str().expect("utf-8"),
        "--prompts",
        "auto",
        "--max-prompts",
        "8",
        "--out",
        refused.to_str().expect("utf-8"),
    ]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("give --gate thresholds.toml"), "{o:?}");
}
