//! Routing drift (issue #30): the experts a model routes each position to, as the evaluation
//! records them (`qdrift_generate::teacher_forced_routes`, batched, left-padded and chunked),
//! are the experts the independent f64 forward pass (`qdrift_tests::reference64`) routes the
//! same position to, on the tiny-arch checkpoints with experts (Llama 4's sigmoid router and
//! GLM-4.5's grouped one among them); and the report of a model
//! with experts carries the routing metrics for every variant, consistent with each other, through
//! shards and a saved reference byte for byte, while a dense model's report has none.

use std::cell::RefCell;

use burn::tensor::DType;
use qdrift_eval::{EvalConfig, Evaluated, Part, Shard, VariantSpec, evaluate, evaluate_any, merge};
use qdrift_generate::{BackendChoice, GenerationConfig, generate};
use qdrift_load::open_model;
use qdrift_model::Llama;
use qdrift_quantize::round_to_fp16_reference;
use qdrift_report::Report;
use qdrift_tests::reference64::{Rounding, naive_logits};
use qdrift_tests::{device, recorded_routes, shared_dir, stories_eval, tiny_arch_prompts};

/// Continuation tokens routed per prompt.
const N: usize = 12;

fn tiny_arch(arch: &str) -> std::path::PathBuf {
    shared_dir().join("models/tiny-arch").join(arch)
}

#[test]
fn recorded_routes_are_the_f64_routers_choices() {
    for arch in ["qwen3_moe", "mixtral", "gpt_oss", "llama4", "glm4_moe"] {
        let dir = tiny_arch(arch);
        let mut host = open_model(&dir, None).unwrap_or_else(|e| panic!("{arch}: {e}")).model;
        round_to_fp16_reference(&mut host);
        let model = Llama::from_host(&host, DType::F32, &device(BackendChoice::Cpu).device).expect("model");
        let prompts = tiny_arch_prompts(arch);
        let config = GenerationConfig { max_new_tokens: N, batch_size: 2, stop_at_eos: None };
        let continuations =
            generate(&model, &device(BackendChoice::Cpu), &prompts, &config, |_| {}).expect("generation");
        let sequences: Vec<(Vec<u32>, Vec<u32>)> = prompts.iter().cloned().zip(continuations).collect();
        let recorded = recorded_routes(&model, &sequences, N, 5);
        let mut compared = 0;
        for (i, (p, c)) in sequences.iter().enumerate() {
            let routes = RefCell::new(Vec::new());
            let tokens: Vec<u32> = p.iter().chain(c).copied().collect();
            naive_logits(&host, &tokens, &Rounding { routes: Some(&routes), ..Default::default() });
            let f64_routes = routes.into_inner();
            assert_eq!(f64_routes.len(), recorded[i].len(), "{arch}: MoE layers");
            for (l, layer) in f64_routes.iter().enumerate() {
                for t in 0..N {
                    // The logits predicting continuation token t come from column p.len() - 1 + t.
                    let want: Vec<u32> = layer[p.len() - 1 + t].iter().map(|&e| e as u32).collect();
                    assert_eq!(recorded[i][l][t], want, "{arch}: prompt {i} layer {l} position {t}");
                    compared += 1;
                }
            }
        }
        println!("{arch}: {compared} (prompt, layer, position) routes equal to the f64 router's");
    }
}

/// A tiny Qwen3-MoE evaluation: 5 prompts in batches of 2 (the last one short), horizons 5
/// and 20.
fn moe_eval(schemes: &[&str]) -> EvalConfig {
    moe_eval_of("qwen3_moe", schemes)
}

/// [`moe_eval`] of tiny-arch checkpoint `arch`.
fn moe_eval_of(arch: &str, schemes: &[&str]) -> EvalConfig {
    let mut cfg = EvalConfig::new(tiny_arch(arch));
    cfg.prompts = Some(5);
    cfg.horizons = vec![5, 20];
    cfg.batch_size = Some(2);
    cfg.chunk = 8;
    cfg.resamples = 200;
    cfg.backend = BackendChoice::Cpu;
    cfg.variants = schemes.iter().map(|s| VariantSpec::Scheme(s.parse().expect("scheme"))).collect();
    cfg
}

fn json(r: &Report) -> String {
    serde_json::to_string_pretty(r).expect("serializes")
}

#[test]
fn a_report_with_experts_has_consistent_routing_numbers_for_every_variant() {
    let report = evaluate(&moe_eval(&["int8", "int4-g32"]), &mut |_| {}).expect("evaluation");
    let moe_layers = 4;
    for v in &report.variants {
        let r = v.routing.as_ref().unwrap_or_else(|| panic!("{}: routing", v.name));
        assert_eq!((r.experts, r.top_k, r.layers.len()), (8, 2, moe_layers), "{}", v.name);
        assert_eq!(r.first_flip.positions.len(), 5);
        let longest = v.horizons.last().expect("horizons");
        let flips = longest.metric("routing_flip_rate").expect("routing_flip_rate").mean;
        // Every layer has the same positions: the mean over layers of the per-layer means over
        // prompts is the overall mean, and so is the mean over positions of the by-position curve.
        let by_layer = r.layers.iter().map(|l| l.flip_rate.mean).sum::<f64>() / moe_layers as f64;
        let by_position = r.flip_by_position.iter().sum::<f64>() / r.flip_by_position.len() as f64;
        assert!((by_layer - flips).abs() < 1e-12 && (by_position - flips).abs() < 1e-12, "{}: {flips}", v.name);
        for h in &v.horizons {
            for name in ["expert_overlap", "routing_flip_rate", "expert_overlap_on_generated_text"] {
                assert!(h.metric(name).is_some(), "{} @{}: {name}", v.name, h.tokens);
            }
            // Until the texts part, the variant's text is the reference's: where every prompt's
            // tokens match up to h, both texts give the same routing numbers.
            let on_ref = h.metric("routing_flip_rate").expect("flips").mean;
            let on_gen = h.metric("routing_flip_rate_on_generated_text").expect("flips (gen.)").mean;
            if v.first_divergence.positions.iter().all(|&p| p >= h.tokens) {
                assert_eq!(on_ref, on_gen, "{} @{}", v.name, h.tokens);
            }
        }
        println!(
            "{}: flips {:.4} overlap {:.4} first flip {:?}",
            v.name,
            flips,
            longest.metric("expert_overlap").expect("overlap").mean,
            r.first_flip.median
        );
    }
    let markdown = qdrift_report::render_markdown(&report);
    assert!(markdown.contains("Routing flips"), "the tables show the routing metrics");

    let dense = evaluate(&stories_eval(3, 3, &["int8"]), &mut |_| {}).expect("dense evaluation");
    for v in &dense.variants {
        assert!(v.routing.is_none() && v.horizons.iter().all(|h| h.metric("routing_flip_rate").is_none()));
    }
}

#[test]
fn routing_goes_through_shards_and_a_saved_reference_unchanged() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let mut cfg = moe_eval(&["int4-g32"]);
    cfg.save_reference = Some(tmp.path().join("store"));
    let whole = evaluate(&cfg, &mut |_| {}).expect("unsharded run saving the reference");
    assert!(whole.variants.iter().all(|v| v.routing.is_some()));
    cfg.save_reference = None;
    for from_store in [false, true] {
        cfg.reference_store = from_store.then(|| tmp.path().join("store"));
        let mut parts = Vec::new();
        for index in 0..2 {
            let mut shard = cfg.clone();
            shard.shard = Some(Shard { index, count: 2 });
            let Evaluated::Part(part) = evaluate_any(&shard, &mut |_| {}).expect("shard runs") else {
                panic!("a shard gives a part")
            };
            let dir = tmp.path().join(format!("part-{from_store}-{index}"));
            std::fs::create_dir_all(&dir).expect("part folder");
            part.write(&dir).expect("part written");
            parts.push(Part::read(&dir).expect("part read back"));
        }
        let merged = merge(parts).expect("merge");
        assert_eq!(json(&merged), json(&whole), "shards (from the store: {from_store}) give the same report");
    }
}

/// SmolLM3, Llama 4 and GLM-4.5 evaluate under int8, w8a8-fp8 and a KV-cache scheme; Llama 4's
/// sigmoid router (its 2 MoE layers, 4 experts, top-1) and GLM-4.5's group-limited one (its 3 MoE
/// layers after the dense layer 0, 8 experts, top-2) get the routing metrics for every variant,
/// SmolLM3 none.
#[test]
fn the_2026_families_evaluate_with_routing_metrics() {
    let schemes = ["int8", "w8a8-fp8", "int8+kv-q8_0"];
    for (arch, routing) in [("smollm3", None), ("llama4", Some((4, 1, 2))), ("glm4_moe", Some((8, 2, 3)))] {
        let report = evaluate(&moe_eval_of(arch, &schemes), &mut |_| {}).expect("evaluation");
        assert_eq!(report.variants.len(), schemes.len() + 1, "{arch}: the noise floor and three schemes");
        for v in &report.variants {
            let longest = v.horizons.last().expect("horizons");
            let tm = longest.metric("token_match_rate").expect("token_match_rate").mean;
            let flips = longest.metric("routing_flip_rate").map(|m| m.mean);
            let shape = v.routing.as_ref().map(|r| (r.experts, r.top_k, r.layers.len()));
            assert_eq!(shape, routing, "{arch} {}", v.name);
            assert_eq!(flips.is_some(), routing.is_some(), "{arch} {}", v.name);
            assert!((0.0..=1.0).contains(&tm) && flips.is_none_or(|f| (0.0..=1.0).contains(&f)), "{arch} {}", v.name);
            println!("{arch} {}: token match {tm:.3}, routing flips {flips:?}", v.name);
        }
    }
}
