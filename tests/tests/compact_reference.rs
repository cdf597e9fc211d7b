//! The compact reference (`--reference-top-k K`) against the exact full-vocabulary KL (the
//! default), on whole evaluations:
//! - stories260K (vocabulary 512): every metric that does not come from KL is identical; KL is a
//!   lower bound of the exact value; a top-K that covers the vocabulary is the exact path;
//! - SmolLM2-135M (vocabulary 49,152), int8 and int4-g128, 8 prompts × 100 tokens, K = 64 … 2048
//!   from the same logits: top-1 agreement identical, KL a lower bound, its error printed. The
//!   bound is not within 1% at K = 64 on this model (see the README): that is why the exact KL
//!   is the default.

use std::path::PathBuf;

use burn::tensor::DType;
use qdrift_eval::{EvalConfig, evaluate};
use qdrift_generate::BackendChoice;
use qdrift_report::{KlMethod, Report};
use qdrift_tests::stories_eval;

/// The metrics computed from the per-position KL divergence, a lower bound in top-K mode (the
/// percentiles too: a quantile of pointwise lower bounds is at most the quantile of the values),
/// and the reverse KL's.
const KL_METRICS: [&str; 9] = [
    "kld",
    "kld_median",
    "kld_p90",
    "kld_p99",
    "excess_kld",
    "kld_reverse",
    "kld_reverse_median",
    "kld_reverse_p90",
    "kld_reverse_p99",
];

/// The metrics computed from the per-position acceptance `Σ min(p, q)`, an upper bound in top-K
/// mode. Every metric in neither list must not depend on K (the top-K overlaps are exact for
/// K = 16 ≥ 5).
const ACCEPTANCE_METRICS: [&str; 5] = [
    "spec_acceptance",
    "spec_sampling_tokens_per_step_g1",
    "spec_sampling_tokens_per_step_g2",
    "spec_sampling_tokens_per_step_g4",
    "spec_sampling_tokens_per_step_g8",
];

fn stories_config() -> EvalConfig {
    stories_eval(6, 4, &["int8", "int4-g32"])
}

/// Every horizon metric of every variant that is not a KL metric, as JSON.
fn non_kl_metrics(report: &Report) -> Vec<String> {
    report
        .variants
        .iter()
        .flat_map(|v| {
            v.horizons.iter().flat_map(move |h| {
                h.iter().filter(|(m, _)| !KL_METRICS.contains(&m.name) && !ACCEPTANCE_METRICS.contains(&m.name)).map(
                    move |(m, e)| {
                        format!(
                            "{} @{} {}: {}",
                            v.name,
                            h.tokens,
                            m.name,
                            serde_json::to_string(e).expect("serializes")
                        )
                    },
                )
            })
        })
        .collect()
}

fn kld(report: &Report, variant: usize, horizon: usize) -> (f64, f64) {
    let m = report.variants[variant].horizons[horizon].metric("kld").expect("kld");
    (m.mean, m.distribution.as_ref().expect("distribution").p99)
}

#[test]
fn stories_compact_reference_is_a_lower_bound_and_changes_nothing_else() {
    let mut cfg = stories_config();
    cfg.reference_top_k = Some(16);
    let compact = evaluate(&cfg, &mut |_| {}).expect("compact evaluation");
    cfg.reference_top_k = None;
    let exact = evaluate(&cfg, &mut |_| {}).expect("exact evaluation");
    cfg.reference_top_k = Some(512);
    let full_k = evaluate(&cfg, &mut |_| {}).expect("K = vocabulary");

    match &compact.reference.kl {
        Some(KlMethod::TopKTail { top_k: 16, tail_mass_max, tail_mass_mean }) => {
            assert!(*tail_mass_mean > 0.0 && tail_mass_mean <= tail_mass_max && *tail_mass_max < 1.0);
            println!("stories260K K = 16: tail mass mean {tail_mass_mean:.3e}, max {tail_mass_max:.3e}");
        }
        other => panic!("compact run reports {other:?}"),
    }
    assert_eq!(exact.reference.kl, Some(KlMethod::Exact));
    assert_eq!(full_k.reference.kl, Some(KlMethod::Exact), "K ≥ vocabulary is the exact path");
    let json = |r: &Report| serde_json::to_string(&r.variants).expect("serializes");
    assert_eq!(json(&full_k), json(&exact));

    assert_eq!(non_kl_metrics(&compact), non_kl_metrics(&exact));
    for v in 0..compact.variants.len() {
        for h in 0..2 {
            let ((c, _), (e, _)) = (kld(&compact, v, h), kld(&exact, v, h));
            println!("{} @{}: KLD K=16 {c:.4e}, exact {e:.4e}", compact.variants[v].name, cfg.horizons[h]);
            assert!(c <= e * (1.0 + 1e-5) + 1e-9, "the compact KL {c} is a lower bound of {e}");
            if v > 0 {
                assert!(c > 0.5 * e, "K = 16 of 512 keeps most of the divergence ({c} vs {e})");
            }
            let mean = |r: &Report, name: &str| r.variants[v].horizons[h].metric(name).expect("metric").mean;
            for name in KL_METRICS.iter().filter(|n| n.starts_with("kld_reverse")) {
                let (c, e) = (mean(&compact, name), mean(&exact, name));
                assert!(c <= e * (1.0 + 1e-5) + 1e-9, "{name}: the compact {c} is a lower bound of {e}");
            }
            for name in ACCEPTANCE_METRICS {
                let (c, e) = (mean(&compact, name), mean(&exact, name));
                assert!(c >= e * (1.0 - 1e-6), "{name}: the compact {c} is an upper bound of {e}");
            }
        }
    }
}

fn smollm2() -> Option<PathBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    path.is_file().then_some(path)
}

/// Mean and p99 of per-position KL values (negative round-off clamped to 0, as reports do).
fn mean_p99(kl: &[f32]) -> (f64, f64) {
    let mut v: Vec<f64> = kl.iter().map(|&x| f64::from(x).max(0.0)).collect();
    v.sort_by(f64::total_cmp);
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    (mean, qdrift_score::quantile_sorted(&v, 0.99).expect("p99"))
}

/// SmolLM2 (vocabulary 49,152), int8 and int4-g128, 8 chat-style prompts × 100 greedy tokens of
/// the FP16 reference, f32, CPU: every position's exact KL and its top-K + tail bound from the
/// same logits. Top-1 agreement and log p are identical (they are kept exactly); the bound is
/// below the exact KL; its error is printed per K. Measured (2-core x86): K = 64 is 7.0% / 5.0%
/// low on the mean (int8 / int4-g128), missing the 1% (mean) / 2% (p99); K = 1024 meets
/// both (0.66% / 0.45%) — why the exact KL is the default (`README.md`).
#[test]
fn smollm2_top_k_bound_against_the_exact_kl() {
    use qdrift_generate::{Forcing, GenerationConfig, generate, teacher_forced_pair};
    use qdrift_model::Llama;
    use qdrift_quantize::{QuantizeOptions, Scheme, quantize_model, round_to_fp16_reference};
    use qdrift_score::{compact_reference_on_device, position_metrics_against_compact, position_metrics_on_device};

    let Some(model) = smollm2() else {
        println!("skipped: SmolLM2 absent (cargo xtask fetch-models)");
        return;
    };
    let mut loaded = qdrift_load::open_model(&model, None).expect("SmolLM2 loads");
    round_to_fp16_reference(&mut loaded.model);
    let dev = qdrift_tests::device(BackendChoice::Cpu);
    let set = qdrift_eval::EvalSet::built_in("chat").expect("chat set");
    let template = loaded.chat_template.clone().expect("SmolLM2 has a chat template");
    let tok = &loaded.tokenizer;
    let piece = |id: Option<u32>| id.map(|i| tok.decode(&[i])).unwrap_or_default();
    let (bos, eos) = (piece(tok.bos_id()), piece(tok.eos_id()));
    let prompts: Vec<Vec<u32>> = set.prompts[..8]
        .iter()
        .map(|p| tok.encode(&qdrift_eval::apply_chat_template(&template, &p.prompt, &bos, &eos).expect("renders")))
        .collect();
    let reference = Llama::from_host(&loaded.model, DType::F32, &dev.device).expect("builds");
    let generation = GenerationConfig { max_new_tokens: 100, batch_size: 8, stop_at_eos: None };
    let tokens = generate(&reference, &dev, &prompts, &generation, |_| {}).expect("generates");
    let text: Vec<(Vec<u32>, Vec<u32>)> = prompts.into_iter().zip(tokens).collect();
    let ks = [64usize, 256, 1024, 2048];
    for scheme in ["int8", "int4-g128"] {
        let s: Scheme = scheme.parse().expect("scheme");
        let weights = quantize_model(&loaded.model, &s, &QuantizeOptions::default()).expect("quantizes").dequantized;
        let variant = Llama::from_host(&weights, DType::F32, &dev.device).expect("builds");
        let (mut exact, mut bounds, mut tails) = (Vec::new(), vec![Vec::new(); ks.len()], Vec::new());
        teacher_forced_pair(
            &reference,
            &variant,
            Forcing { device: &dev, sequences: &text, batch_size: 8, chunk: 25 },
            |p| {
                let [b, t, _] = p.reference.dims();
                let tokens: Vec<u32> =
                    (0..b).flat_map(|i| text[p.first_prompt + i].1[p.start..p.start + t].to_vec()).collect();
                let e = position_metrics_on_device(p.reference.clone(), p.variant.clone(), &tokens).expect("exact");
                for (j, &k) in ks.iter().enumerate() {
                    let c = compact_reference_on_device(p.reference.clone(), &tokens, k).expect("compact");
                    let m = position_metrics_against_compact(&c, p.variant.clone(), &tokens).expect("bound");
                    assert_eq!(m.top1_agree, e.top1_agree, "top-1 agreement is kept exactly");
                    assert_eq!(m.logp_var_of_token, e.logp_var_of_token);
                    bounds[j].extend(m.kld);
                    if k == 64 {
                        tails.extend(c.tail_logp.iter().map(|&l| f64::from(l).exp()));
                    }
                }
                exact.extend(e.kld);
            },
        )
        .expect("teacher forcing");
        assert_eq!(exact.len(), 800);
        let (e_mean, e_p99) = mean_p99(&exact);
        let tail_mean = tails.iter().sum::<f64>() / tails.len() as f64;
        println!(
            "SmolLM2 {scheme}, 8 × 100: exact KLD mean {e_mean:.5e}, p99 {e_p99:.5e}; top-64 tail mass mean {tail_mean:.3e}"
        );
        for (j, &k) in ks.iter().enumerate() {
            let (c_mean, c_p99) = mean_p99(&bounds[j]);
            let (mean_err, p99_err) = ((e_mean - c_mean) / e_mean, (e_p99 - c_p99) / e_p99);
            println!(
                "  K = {k:>4}: mean {c_mean:.5e} ({:.2}% low), p99 {c_p99:.5e} ({:.2}% low)",
                100.0 * mean_err,
                100.0 * p99_err
            );
            assert!(
                c_mean <= e_mean * (1.0 + 1e-6) && c_p99 <= e_p99 * (1.0 + 1e-6),
                "{scheme} K = {k}: a lower bound"
            );
            if k >= 1024 {
                assert!(mean_err < 0.01 && p99_err < 0.02, "{scheme}: K = {k} within 1% / 2% ({mean_err}, {p99_err})");
            }
        }
    }
}
