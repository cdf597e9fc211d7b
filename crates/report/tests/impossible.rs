//! Reports no run can produce are refused by [`Report::read`] and so by `qdrift gate` (exit 2),
//! with one line naming the file, the variant, the metric and horizon, and the problem; every
//! report qdrift wrote (the sample and the committed examples) still reads.

mod common;

use std::path::{Path, PathBuf};

use common::{mean_ci, temp_dir};
use qdrift_report::testing::{sample_moe_report, sample_report};
use qdrift_report::{Distribution, Estimate, Report, RoutingDrift, Variant, run_gate};

/// The sample report with `edit` applied to its variant `int8`.
fn edited(edit: impl FnOnce(&mut Variant)) -> Report {
    let mut r = sample_report();
    edit(r.variants.iter_mut().find(|v| v.name == "int8").expect("int8"));
    r
}

/// Sets `metric` at `horizon` of `v`.
fn set(v: &mut Variant, horizon: usize, metric: &str, e: Estimate) {
    let h = v.horizons.iter_mut().find(|h| h.tokens == horizon).expect("horizon");
    h.set(metric, e).expect("known metric");
}

/// Writes `report` without validating it (as a hand edit would) and returns the one-line error
/// of reading it back, after checking that it names the file.
fn refusal(test: &str, report: &Report) -> String {
    let path = temp_dir(test).join("report.json");
    std::fs::write(&path, serde_json::to_string(report).expect("serializes")).expect("writes");
    let e = Report::read(&path).expect_err("refused").to_string();
    assert!(e.starts_with(&format!("{}: invalid report: ", path.display())), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
    e
}

fn assert_contains(e: &str, needles: &[&str]) {
    for n in needles {
        assert!(e.contains(n), "{n:?} missing from: {e}");
    }
}

#[test]
fn a_negative_kl_divergence_is_refused() {
    let r = edited(|v| set(v, 100, "excess_kld", mean_ci(-0.5, -0.6, -0.4)));
    assert!(r.validate().is_ok(), "an excess may be negative");
    let mut r = edited(|_| {});
    let v = r.variants.iter_mut().find(|v| v.name == "int8").unwrap();
    let h = v.horizons.iter_mut().find(|h| h.tokens == 100).unwrap();
    let kld = Estimate { mean: -0.01, ci95: [-0.02, 0.0], ..*h.metric("kld").unwrap() };
    h.set("kld", kld).unwrap();
    let e = refusal("negative-kl", &r);
    assert_contains(&e, &["variant int8", "kld = -0.0", "not ≥ 0", "at horizon 100"]);
}

#[test]
fn a_mean_outside_its_interval_is_refused_beyond_rounding() {
    let e = refusal("mean-outside", &edited(|v| set(v, 10, "token_match_rate", mean_ci(0.95, 0.5, 0.9))));
    assert_contains(&e, &["variant int8", "token_match_rate mean 0.95 is outside its interval", "at horizon 10"]);
    // A difference of summation order is not a report no run wrote.
    let r = edited(|v| set(v, 10, "token_match_rate", mean_ci(0.9 + 1e-12, 0.5, 0.9)));
    assert!(r.validate().is_ok());
}

#[test]
fn a_reversed_interval_is_refused_naming_the_file() {
    let e = refusal("reversed", &edited(|v| set(v, 1000, "top1_agreement", mean_ci(0.5, 0.6, 0.4))));
    assert_contains(&e, &["variant int8", "top1_agreement interval [0.6, 0.4] is reversed", "at horizon 1000"]);
}

#[test]
fn an_exact_match_bound_outside_the_unit_interval_is_refused() {
    let e = refusal("wilson", &edited(|v| set(v, 10, "exact_match_fraction", mean_ci(0.5, 0.4, 1.2))));
    assert_contains(&e, &["exact_match_fraction = 1.2, not ∈ [0, 1]", "at horizon 10"]);
}

#[test]
fn unordered_quantiles_are_refused() {
    let mut r = sample_report();
    let v = r.variants.iter_mut().find(|v| v.name == "int8").unwrap();
    let h = v.horizons.iter_mut().find(|h| h.tokens == 10).unwrap();
    let kld = *h.metric("kld").unwrap();
    let d = Distribution { median: 0.5, p90: 0.2, p99: 0.6, max: 0.7 };
    h.set("kld", Estimate { distribution: Some(d), ..kld }).unwrap();
    let e = refusal("quantiles", &r);
    assert_contains(&e, &["variant int8", "kld distribution is not ordered (median 0.5 ≤ p90 0.2", "at horizon 10"]);
}

#[test]
fn a_survival_curve_that_rises_or_starts_elsewhere_is_refused() {
    let e = refusal("survival-rises", &edited(|v| v.first_divergence.survival.push((1000, 1.0))));
    assert_contains(&e, &["variant int8", "first_divergence.survival rises"]);
    let e = refusal("survival-start", &edited(|v| v.first_divergence.survival[0] = (1, 1.0)));
    assert_contains(&e, &["first_divergence.survival starts at Some((1, 1.0)), not at (0, 1)"]);
    let e = refusal("survival-range", &edited(|v| v.first_divergence.survival.push((1000, -0.5))));
    assert_contains(&e, &["first_divergence.survival at t = 1000 = -0.5, not ∈ [0, 1]"]);
}

#[test]
fn lengths_and_counts_other_than_the_workload_are_refused() {
    let e = refusal("per-position", &edited(|v| v.per_position.kld.push(0.0)));
    assert_contains(&e, &["variant int8", "per_position.kld has 1001 entries, not max(horizons) = 1000"]);
    let e = refusal(
        "positions",
        &edited(|v| {
            v.first_divergence.positions.pop();
        }),
    );
    assert_contains(&e, &["first_divergence.positions has 71 entries for 72 prompts"]);
    let e = refusal("censored", &edited(|v| v.first_divergence.censored = 73));
    assert_contains(&e, &["first_divergence.censored = 73 > 72 prompts"]);
    let e = refusal("censored-count", &edited(|v| v.first_divergence.censored += 1));
    assert_contains(&e, &["first_divergence.censored = ", "positions are the longest horizon 1000"]);
    let mut r = sample_report();
    r.workload.eval_set.prompts.pop();
    assert_contains(&refusal("eval-set", &r), &["eval_set.prompts has 71 ids for 72 prompts"]);
}

#[test]
fn a_negative_or_infinite_bits_per_weight_is_refused() {
    let e = refusal("bpw", &edited(|v| v.bits_per_weight = -8.0));
    assert_contains(&e, &["variant int8", "bits_per_weight = -8, not ≥ 0"]);
    // JSON has no infinity: validation refuses it before anything is written.
    let e = edited(|v| v.bits_per_weight = f64::INFINITY).validate().unwrap_err().to_string();
    assert_contains(&e, &["bits_per_weight = inf"]);
}

/// A cosine similarity above 1 (f64 rounding of two nearly equal tensors, clamped where it is
/// computed) and a stop token outside the vocabulary are no run's.
#[test]
fn a_cosine_above_one_or_a_stop_token_past_the_vocabulary_is_refused() {
    let mut r = edited(|_| {});
    let v = r.variants.iter_mut().find(|v| !v.per_tensor_error.is_empty()).expect("a quantized variant");
    v.per_tensor_error[0].cosine = 1.0000000000000002;
    assert_contains(&refusal("cosine", &r), &["cosine = 1.0000000000000002, not in [-1, 1]"]);
    let mut r = edited(|_| {});
    r.model.stop_token_id = Some(r.model.shape.vocab_size as u32);
    assert_contains(&refusal("stop-token", &r), &["model.stop_token_id 49152 is not below vocab_size 49152"]);
}

#[test]
fn the_gate_exits_2_on_an_impossible_report_naming_it() {
    let dir = temp_dir("gate-impossible");
    let report = dir.join("report.json");
    let r = edited(|v| set(v, 100, "token_match_rate", mean_ci(0.99, 0.5, 0.6)));
    std::fs::write(&report, serde_json::to_string(&r).unwrap()).unwrap();
    let thresholds = dir.join("t.toml");
    std::fs::write(&thresholds, "[variant.\"int8\"]\n\"token_match_rate@100\" = { min = 0.9, bound = \"point\" }\n")
        .unwrap();
    let run = run_gate(&report, &thresholds, None);
    assert_eq!(run.exit_code, 2, "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
    assert_eq!(run.stderr.lines().count(), 1, "{run:?}");
    assert_contains(&run.stderr, &[&report.display().to_string(), "token_match_rate mean 0.99 is outside"]);
}

/// Every `reports/*/report.json` in the repository.
fn committed_reports() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../reports");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("reports/ reads")
        .map(|e| e.expect("entry").path().join("report.json"))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found
}

/// The report of a model with experts with `edit` applied to the routing drift of its variant
/// `int8`.
fn routed(edit: impl FnOnce(&mut RoutingDrift)) -> Report {
    let mut r = sample_moe_report();
    let v = r.variants.iter_mut().find(|v| v.name == "int8").expect("int8");
    edit(v.routing.as_mut().expect("int8 has routing"));
    r
}

#[test]
fn impossible_expert_counts_are_refused() {
    let e = refusal("top-k-0", &routed(|r| r.top_k = 0));
    assert_contains(&e, &["variant int8", "routing.top_k = 0: each token is routed to at least one expert"]);
    let e = refusal("experts-below-k", &routed(|r| r.experts = 1));
    assert_contains(&e, &["variant int8", "routing.experts = 1 < routing.top_k = 2"]);
    // Routing to every expert is a (degenerate) model a run can evaluate.
    assert!(routed(|r| r.experts = 2).validate().is_ok());
}

#[test]
fn a_first_flip_is_checked_as_a_first_divergence_is() {
    let e = refusal("first-flip-rises", &routed(|r| r.first_flip.survival.push((1000, 1.0))));
    assert_contains(&e, &["variant int8", "routing.first_flip.survival rises"]);
    let e = refusal("first-flip-start", &routed(|r| r.first_flip.survival[0] = (1, 1.0)));
    assert_contains(&e, &["routing.first_flip.survival starts at Some((1, 1.0)), not at (0, 1)"]);
    let e = refusal(
        "first-flip-positions",
        &routed(|r| {
            r.first_flip.positions.pop();
        }),
    );
    assert_contains(&e, &["variant int8", "routing.first_flip.positions has 71 entries for 72 prompts"]);
    let e = refusal("first-flip-past", &routed(|r| r.first_flip.positions[0] = 1001));
    assert_contains(&e, &["routing.first_flip position 1001 is past the longest horizon 1000"]);
    let e = refusal("first-flip-censored", &routed(|r| r.first_flip.censored += 1));
    assert_contains(&e, &["routing.first_flip.censored = ", "positions are the longest horizon 1000"]);
    let e = refusal("first-flip-median", &routed(|r| r.first_flip.median = Some(1000)));
    assert_contains(&e, &["routing.first_flip.median = 1000 is past the longest horizon 1000"]);
    // The first divergence's messages still name their own field.
    let e = refusal("first-divergence-median", &edited(|v| v.first_divergence.median = Some(1000)));
    assert_contains(&e, &["variant int8: first_divergence.median = 1000 is past the longest horizon 1000"]);
}

#[test]
fn flips_by_position_other_than_one_share_per_position_are_refused() {
    let e = refusal("flip-by-position-length", &routed(|r| r.flip_by_position.push(0.0)));
    assert_contains(&e, &["variant int8", "routing.flip_by_position has 1001 entries, not max(horizons) = 1000"]);
    let e = refusal("flip-by-position-range", &routed(|r| r.flip_by_position[7] = 1.5));
    assert_contains(&e, &["variant int8", "routing.flip_by_position at t = 7 = 1.5, not ∈ [0, 1]"]);
    let e = routed(|r| r.flip_by_position[7] = f64::NAN).validate().unwrap_err().to_string();
    assert_contains(&e, &["routing.flip_by_position at t = 7 = NaN"]);
}

#[test]
fn routing_layers_missing_or_out_of_order_are_refused() {
    let e = refusal("layers-empty", &routed(|r| r.layers.clear()));
    assert_contains(&e, &["variant int8", "routing.layers is empty"]);
    let e = refusal("layers-twice", &routed(|r| r.layers[1].layer = r.layers[0].layer));
    assert_contains(&e, &["variant int8", "routing.layers: layer 0 after layer 0 (layers ascend, each once)"]);
    let e = refusal("layers-descending", &routed(|r| r.layers.reverse()));
    assert_contains(&e, &["routing.layers: layer 15 after layer 29"]);
}

#[test]
fn a_layers_estimates_are_checked_as_their_metrics_are() {
    let e = refusal("layer-flip-range", &routed(|r| r.layers[1].flip_rate = mean_ci(1.5, 1.4, 1.6)));
    assert_contains(&e, &["variant int8", "routing layer 15: flip_rate: routing_flip_rate = 1.5, not ∈ [0, 1]"]);
    let e = refusal("layer-flip-outside", &routed(|r| r.layers[0].flip_rate = mean_ci(0.5, 0.1, 0.2)));
    assert_contains(&e, &["routing layer 0: flip_rate: routing_flip_rate mean 0.5 is outside its interval"]);
    let e = refusal("layer-overlap-reversed", &routed(|r| r.layers[2].expert_overlap = mean_ci(0.9, 0.95, 0.85)));
    assert_contains(&e, &["routing layer 29: expert_overlap: expert_overlap interval [0.95, 0.85] is reversed"]);
    let d = Distribution { median: 0.9, p90: 0.9, p99: 0.9, max: 0.9 };
    let e = refusal("layer-overlap-distribution", &routed(|r| r.layers[2].expert_overlap.distribution = Some(d)));
    assert_contains(&e, &["routing layer 29: expert_overlap: expert_overlap has a distribution it does not define"]);
    let e = refusal("layer-median", &routed(|r| r.layers[1].first_flip_median = Some(1000)));
    assert_contains(
        &e,
        &["variant int8", "routing layer 15: first_flip_median = 1000 is past the longest horizon 1000"],
    );
}

#[test]
fn every_report_qdrift_wrote_still_reads() {
    sample_report().validate().expect("the sample report validates");
    sample_moe_report().validate().expect("the sample report of a model with experts validates");
    let reports = committed_reports();
    assert!(!reports.is_empty(), "no committed example report found");
    for path in reports {
        Report::read(&path).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Sets int8's per-prompt values of `metric` at horizon 100 to `values`, the metric's mean kept
/// their mean.
fn per_prompt(v: &mut Variant, metric: &str, values: Vec<f64>) {
    let h = v.horizons.iter_mut().find(|h| h.tokens == 100).expect("horizon");
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let e = *h.metric(metric).expect("metric");
    let [lo, hi] = e.ci95;
    h.set(metric, Estimate { mean, ci95: [lo.min(mean), hi.max(mean)], ..e }).expect("known metric");
    h.set_per_prompt(metric, values).expect("a metric with per-prompt values");
}

/// Half the largest KL divergence over int8's positions of horizon 100: a prompt's mean KLD it
/// could have.
fn half_max(v: &Variant) -> f64 {
    0.5 * v.horizon(100).expect("horizon").metric("kld").expect("kld").distribution.expect("distribution").max
}

/// 72 values alternating `a` and `b`.
fn alternating(a: f64, b: f64) -> Vec<f64> {
    (0..72).map(|i| if i % 2 == 0 { a } else { b }).collect()
}

#[test]
fn per_prompt_values_outside_the_metrics_range_are_refused_though_their_mean_agrees() {
    // Rates of 2.0 and -1.2 average 0.4, a rate.
    let e = refusal("rate-2", &edited(|v| per_prompt(v, "token_match_rate", alternating(2.0, -1.2))));
    assert_contains(&e, &["variant int8: per_prompt.token_match_rate value 0 = 2.0, not ∈ [0, 1] at horizon 100"]);
    // A negative KL divergence whose mean is still positive: none, however small.
    let e = refusal("kld-negative", &edited(|v| per_prompt(v, "kld", alternating(half_max(v), -1e-12))));
    assert_contains(&e, &["variant int8: per_prompt.kld value 1 = -1e-12, not ≥ 0 at horizon 100"]);
    // Verification steps are whole and at most one per position.
    let e = refusal("steps", &edited(|v| per_prompt(v, "spec_tokens_per_step_g1", alternating(150.0, 50.0))));
    assert_contains(
        &e,
        &["per_prompt.spec_tokens_per_step_g1 value 0 = 150.0, not a whole number of steps from 1 to 100"],
    );
    // The same values within range read.
    assert!(edited(|v| per_prompt(v, "token_match_rate", alternating(0.9, 0.7))).validate().is_ok());
    assert!(edited(|v| per_prompt(v, "kld", alternating(half_max(v), 0.0))).validate().is_ok());
}

#[test]
fn a_prompts_kl_above_the_largest_position_value_is_refused() {
    let mut r = sample_report();
    let v = r.variants.iter_mut().find(|v| v.name == "int8").unwrap();
    let max = v.horizon(100).unwrap().metric("kld").unwrap().distribution.unwrap().max;
    per_prompt(v, "kld", alternating(2.0 * max, 0.0));
    let e = refusal("kld-above-max", &r);
    assert_contains(&e, &["variant int8: per_prompt.kld value 0 = ", "above kld's largest value over positions"]);
}

#[test]
fn a_pooled_quantile_other_than_the_distributions_is_refused() {
    // The table shows kld_reverse's p99 from kld_reverse_p99: 1e308 there is no run's.
    let mut r = sample_report();
    let v = r.variants.iter_mut().find(|v| v.name == "int8").unwrap();
    let d = v.horizon(100).unwrap().metric("kld_reverse").unwrap().distribution.unwrap();
    set(v, 100, "kld_reverse_p99", mean_ci(1e308, 1e308, 1e308));
    let e = refusal("reverse-p99", &r);
    assert_contains(
        &e,
        &[&format!(
            "variant int8: kld_reverse_p99 = 1e308, but kld_reverse's p99 over the same positions is {:?}",
            d.p99
        )],
    );
    // An interval reaching above every position's value.
    let mut r = sample_report();
    let v = r.variants.iter_mut().find(|v| v.name == "int8").unwrap();
    let d = v.horizon(100).unwrap().metric("kld").unwrap().distribution.unwrap();
    set(v, 100, "kld_p99", mean_ci(d.p99, d.p99, 2.0 * d.max));
    let e = refusal("p99-interval", &r);
    assert_contains(&e, &["variant int8: kld_p99 interval", "reaches above kld's largest value over positions"]);
}
