//! The new blocks of issue #30 (tiny-arch checkpoints: Qwen3's q/k norms and explicit head width,
//! Qwen3-MoE's and gpt-oss's experts, Qwen2-MoE's shared expert (`qdrift_tests::qwen2_moe`),
//! gpt-oss's sinks, biases, YaRN and sliding windows) with a variant's run-time roundings, against the independent f64 forward pass with the same roundings
//! (`qdrift_tests::reference64`), on the CPU backend: weights in int8 with a KV scheme, and with
//! an activation scheme, decoded (three prompts in one left-padded batch) and teacher-forced (two
//! sequences a batch, seven positions a pass).
//!
//! First, without roundings, every kernel combination of the CPU backend (Burn's or the host's
//! linear layers, composed or host attention; a block the host kernels do not cover falls back to
//! Burn) on all seven checkpoints and the Qwen2-MoE agrees with the f64 pass to 1e-5 of the logits' scale.
//!
//! Tolerance as `fake_quant.rs`'s stories260K test: a position agrees when all its logits are
//! within [`AGREE`] of the f64 pass. Where f32 and f64 put a value on opposite sides of a
//! rounding boundary it moves by a whole step, and the change reaches every later position of
//! its sequence through the cache: one int8 key 1e-7 (relative) from its boundary costs a whole
//! sequence. So the f64 pass follows the model there ([`resolved`]): an int8 rounding it finds
//! within `reference64::AMBIGUOUS` (1e-6 relative) of its boundary, at or before the first
//! disagreeing position, may go to the other neighbour when that makes the position agree, at
//! most [`MAX_FLIPS`] per sequence and run (decoding and chunked teacher forcing sum in other
//! orders and may flip different ones). The test then asks that at least `min_agree` of the
//! positions agree, and that without the run-time rounding at most 10% would: a rounding at the
//! wrong place or with the wrong scale is not an ulp-sized flip away and leaves almost no
//! position agreeing.

use std::cell::RefCell;

use burn::tensor::{DType, Device, Tensor};
use qdrift_generate::{BackendChoice, Forcing, GenerationConfig, generate, teacher_forced};
use qdrift_load::{HostModel, open_model};
use qdrift_model::{AttentionKernel, InputAmax, LinearKernel, Llama};
use qdrift_quantize::{DynamicFormat, QuantizeOptions, Recipe, quantize_model, round_to_fp16_reference};
use qdrift_tests::reference64::{Rounding, Site, Sites, naive_logits};
use qdrift_tests::{cached_logits, device, shared_dir, tiny_arch_prompts};

/// Positions whose logits all agree with the f64 pass within this.
const AGREE: f64 = 1e-4;

/// New tokens per prompt.
const N: usize = 24;

fn read(x: Tensor<2>) -> Vec<f32> {
    x.into_data().try_into_vec::<f32>().expect("f32")
}

/// Largest |a − b| of each predicted position of every sequence, sorted.
fn row_errors(got: &[Vec<Vec<f32>>], want: &[Vec<Vec<f64>>]) -> Vec<f64> {
    let mut e: Vec<f64> = got
        .iter()
        .zip(want)
        .flat_map(|(g, w)| g.iter().zip(w))
        .map(|(g, w)| g.iter().zip(w).fold(0.0f64, |m, (g, w)| m.max((f64::from(*g) - w).abs())))
        .collect();
    e.sort_by(f64::total_cmp);
    e
}

/// Fraction of positions within [`AGREE`].
fn agreeing(errors: &[f64]) -> f64 {
    errors.iter().filter(|e| **e <= AGREE).count() as f64 / errors.len() as f64
}

/// A tiny-arch checkpoint at the FP16 reference's precision, and its golden prompts; `qwen2_moe`
/// is `qdrift_tests::qwen2_moe`'s checkpoint (layer 1 dense), with the Qwen3-MoE's prompts.
fn reference(arch: &str) -> (HostModel, Vec<Vec<u32>>) {
    let tiny = |a: &str| shared_dir().join("models/tiny-arch").join(a);
    let made = tempfile::tempdir().expect("tempdir");
    let dir = if arch == "qwen2_moe" {
        qdrift_tests::qwen2_moe(made.path(), &[1]);
        made.path().to_path_buf()
    } else {
        tiny(arch)
    };
    let loaded = open_model(&dir, None).unwrap_or_else(|e| panic!("{arch} must load from {}: {e}", dir.display()));
    let mut model = loaded.model;
    round_to_fp16_reference(&mut model);
    (model, tiny_arch_prompts(if arch == "qwen2_moe" { "qwen3_moe" } else { arch }))
}

/// `archs` on every kernel combination of the CPU backend against the f64 pass.
fn kernels_match_the_f64_forward_pass(archs: &[&str]) {
    for &arch in archs {
        let (weights, prompts) = reference(arch);
        // Prompt 0 then prompt 2: 49 positions, past the sliding windows of 16.
        let tokens = [prompts[0].clone(), prompts[2].clone()].concat();
        let want = naive_logits(&weights, &tokens, &Rounding::default());
        let scale = want.iter().flatten().fold(0.0f64, |m, v| m.max(v.abs()));
        for linear in [LinearKernel::Burn, LinearKernel::Host] {
            let model = Llama::from_host_with(&weights, DType::F32, &Device::flex(), linear).expect("model builds");
            for kernel in [AttentionKernel::Composed, AttentionKernel::Host] {
                let got = cached_logits(&model, &Device::flex(), &tokens, (prompts[0].len(), 1), kernel);
                let err = got
                    .iter()
                    .flatten()
                    .zip(want.iter().flatten())
                    .fold(0.0f64, |m, (g, w)| m.max((f64::from(*g) - w).abs()));
                println!("{arch}, {linear:?} linear, {kernel:?} attention: max |Δlogit| {err:.2e} (scale {scale:.2})");
                assert!(err <= 1e-5 * scale, "{arch}, {linear:?} linear, {kernel:?} attention: max |Δlogit| {err:.2e}");
            }
        }
    }
}

#[test]
fn dense_blocks_match_the_f64_forward_pass_on_every_cpu_kernel() {
    kernels_match_the_f64_forward_pass(&["qwen3", "gemma2", "gemma3", "phi3"]);
}

#[test]
fn experts_match_the_f64_forward_pass_on_every_cpu_kernel() {
    kernels_match_the_f64_forward_pass(&["qwen3_moe", "qwen2_moe", "mixtral", "gpt_oss"]);
}

/// Logits of the variant decoding its own continuation, then teacher-forcing it.
type Runs = (Vec<Vec<u32>>, Vec<Vec<Vec<f32>>>, Vec<Vec<Vec<f32>>>);

fn decode_and_force(model: &Llama, prompts: &[Vec<u32>], choice: BackendChoice) -> Runs {
    let dev = device(choice);
    let mut decoded = vec![vec![Vec::new(); N]; prompts.len()];
    let config = GenerationConfig { max_new_tokens: N, batch_size: prompts.len(), stop_at_eos: None };
    let tokens = generate(model, &dev, prompts, &config, |s| {
        let v = s.logits.dims()[1];
        for (b, row) in read(s.logits.clone()).chunks(v).enumerate() {
            decoded[s.first_prompt + b][s.step] = row.to_vec();
        }
    })
    .expect("generation");
    let sequences: Vec<(Vec<u32>, Vec<u32>)> = prompts.iter().cloned().zip(tokens.iter().cloned()).collect();
    let mut forced = vec![vec![Vec::new(); N]; prompts.len()];
    teacher_forced(model, Forcing { device: &dev, sequences: &sequences, batch_size: 2, chunk: 7 }, |f| {
        let [b, t, v] = f.logits.dims();
        let data = f.logits.to_data().try_into_vec::<f32>().expect("f32");
        for i in 0..b {
            for j in 0..t {
                forced[f.first_prompt + i][f.start + j] = data[(i * t + j) * v..(i * t + j + 1) * v].to_vec();
            }
        }
    })
    .expect("teacher forcing");
    (tokens, decoded, forced)
}

/// Ambiguous int8 roundings ([`qdrift_tests::reference64::AMBIGUOUS`]) the f64 pass may round to the other
/// neighbour, per sequence and run, to follow the model's f32 choice.
const MAX_FLIPS: usize = 3;

/// Index of the first of `got`'s positions not within [`AGREE`] of `want`'s.
fn first_disagreeing(got: &[Vec<f32>], want: &[Vec<f64>]) -> Option<usize> {
    got.iter().zip(want).position(|(g, w)| g.iter().zip(w).any(|(g, w)| (f64::from(*g) - w).abs() > AGREE))
}

/// The f64 logits of `sequence`'s `N` predicted positions (from `from`) with roundings `r`,
/// resolved against the model's `got`: where a position disagrees, an int8 rounding the f64 pass
/// finds within [`qdrift_tests::reference64::AMBIGUOUS`] of its boundary, at or before that position, is
/// rounded to the other neighbour (the smallest distance first) when that makes the position
/// agree; at most [`MAX_FLIPS`] of them. A rounding at the wrong place or with the wrong scale
/// is never within an ulp-sized flip of the model. Returns the logits and the flips made.
fn resolved(
    weights: &HostModel,
    sequence: &[u32],
    from: usize,
    r: &Rounding,
    got: &[Vec<f32>],
) -> (Vec<Vec<f64>>, usize) {
    let pass = |flipped: &[usize]| {
        let sites = RefCell::new(Sites::flipping(flipped.to_vec()));
        let logits = naive_logits(weights, sequence, &Rounding { sites: Some(&sites), ..*r })[from..][..N].to_vec();
        (logits, sites.into_inner().ambiguous)
    };
    let mut flipped = Vec::new();
    let (mut want, mut ambiguous) = pass(&flipped);
    while let Some(bad) = first_disagreeing(got, &want) {
        if flipped.len() == MAX_FLIPS {
            break;
        }
        let mut candidates: Vec<Site> =
            ambiguous.iter().filter(|s| s.position <= from + bad && !flipped.contains(&s.ordinal)).copied().collect();
        candidates.sort_by(|a, b| a.distance.total_cmp(&b.distance));
        let better = candidates.iter().find_map(|c| {
            let trial = [flipped.clone(), vec![c.ordinal]].concat();
            let (w, a) = pass(&trial);
            (first_disagreeing(got, &w).is_none_or(|b| b > bad)).then_some((trial, w, a))
        });
        let Some((f, w, a)) = better else { break };
        (flipped, want, ambiguous) = (f, w, a);
    }
    (want, flipped.len())
}

/// `arch`'s variants `(recipe, min_agree)` against the f64 pass with their roundings, each
/// sequence and run's ambiguous int8 roundings resolved as the model's ([`resolved`]).
fn variants_match_the_f64_forward_pass(arch: &str, recipes: &[(&str, f64)]) {
    variants_match_on(arch, recipes, BackendChoice::Cpu);
}

/// [`variants_match_the_f64_forward_pass`] on a given backend.
fn variants_match_on(arch: &str, recipes: &[(&str, f64)], choice: BackendChoice) {
    let (reference, prompts) = reference(arch);
    for &(name, min_agree) in recipes {
        let recipe: Recipe = name.parse().expect("recipe");
        let weights =
            quantize_model(&reference, &recipe.weights, &QuantizeOptions::default()).expect("quantizes").dequantized;
        let dev = device(choice);
        let mut model = Llama::from_host(&weights, DType::F32, &dev.device).expect("model builds");
        model.apply_runtime(&recipe).expect("the recipe fits");
        // NVFP4's static global input scales, calibrated on the reference over the prompts.
        let calibrated = (recipe.activations.map(|a| a.format) == Some(DynamicFormat::Nvfp4)).then(|| {
            let unrounded = Llama::from_host(&reference, DType::F32, &dev.device).expect("reference builds");
            let amax = unrounded.calibrate_inputs(&prompts);
            assert_eq!(amax, unrounded.calibrate_inputs(&prompts), "calibration is deterministic");
            assert_eq!(amax.sequences, prompts.len());
            assert!(amax.layers.iter().flatten().all(|&a| a > 0.0), "every linear input seen: {:?}", amax.layers);
            amax
        });
        if let Some(amax) = &calibrated {
            model.set_input_scales(amax);
        }
        let scales = calibrated.as_ref().map(InputAmax::global_scales);
        let (tokens, decoded, forced) = decode_and_force(&model, &prompts, choice);
        let rounded = Rounding {
            activations: recipe.activations,
            kv_cache: recipe.kv_cache,
            input_scales: scales.as_deref(),
            ..Default::default()
        };
        let (mut want_dec, mut want_tf, mut flips) = (Vec::new(), Vec::new(), [0usize; 2]);
        let (mut unrounded, mut want_plain) = (Vec::new(), Vec::new());
        for (i, (p, c)) in prompts.iter().zip(&tokens).enumerate() {
            let sequence = [p.clone(), c.clone()].concat();
            let r = Rounding { prompt: p.len(), ..rounded };
            let (w, f) = resolved(&weights, &sequence, p.len() - 1, &r, &decoded[i]);
            want_dec.push(w);
            flips[0] += f;
            let (w, f) = resolved(&weights, &sequence, p.len() - 1, &r, &forced[i]);
            want_tf.push(w);
            flips[1] += f;
            let plain = naive_logits(&weights, &sequence, &Rounding::default())[p.len() - 1..][..N].to_vec();
            let plain: Vec<Vec<f32>> = plain.into_iter().map(|r| r.into_iter().map(|v| v as f32).collect()).collect();
            // The unrounded pass gets the same chance to be resolved: flips cannot make it agree.
            want_plain.push(resolved(&weights, &sequence, p.len() - 1, &r, &plain).0);
            unrounded.push(plain);
        }
        let (dec, tf) = (row_errors(&decoded, &want_dec), row_errors(&forced, &want_tf));
        let moved = row_errors(&unrounded, &want_plain);
        println!(
            "{} {arch} {name}: positions within {AGREE:e} of f64: decoding {:.0}%, teacher forcing {:.0}% \
             (median |Δ| {:.1e}, {:.1e}; ambiguous roundings flipped {}, {}); without the run-time rounding {:.0}% \
             (median |Δ| {:.1e})",
            dev.adapter,
            100.0 * agreeing(&dec),
            100.0 * agreeing(&tf),
            dec[dec.len() / 2],
            tf[tf.len() / 2],
            flips[0],
            flips[1],
            100.0 * agreeing(&moved),
            moved[moved.len() / 2],
        );
        assert!(
            agreeing(&dec) >= min_agree && agreeing(&tf) >= min_agree,
            "{arch} {name}: too few positions agree (decoding {:.2}, teacher forcing {:.2})",
            agreeing(&dec),
            agreeing(&tf)
        );
        assert!(agreeing(&moved) <= 0.1, "{arch} {name}: the rounding leaves the logits unchanged");
    }
}

/// Int8 weights with an int8 KV cache (after the q/k norms and RoPE), and per-token int8
/// activations (W8A8).
const DENSE: [(&str, f64); 3] = [("int8+kv-int8", 0.66), ("w8a8-int8", 0.66), ("int8+a-int8-tensor+kv-q8_0", 0.4)];

#[test]
fn qwen3_variants_match_the_f64_forward_pass() {
    variants_match_the_f64_forward_pass("qwen3", &DENSE);
}

#[test]
fn qwen3_moe_variants_match_the_f64_forward_pass() {
    variants_match_the_f64_forward_pass("qwen3_moe", &DENSE);
}

#[test]
fn qwen2_moe_variants_match_the_f64_forward_pass() {
    variants_match_the_f64_forward_pass("qwen2_moe", &DENSE);
}

#[test]
fn gpt_oss_variants_match_the_f64_forward_pass() {
    variants_match_the_f64_forward_pass("gpt_oss", &DENSE);
}

/// W4A4: MXFP4 weights and activations (blocks of 32 along every linear input: the tiny
/// checkpoints' widths are multiples of 32), alone and with an FP8 KV cache, and NVFP4 weights and
/// activations, the activations under static global input scales calibrated on the reference over
/// the prompts (`Llama::calibrate_inputs`), on the CPU backend and wgpu. Measured: every position
/// agrees on both; `min_agree` leaves room for one cached E4M3 key on the other side of a rounding
/// boundary, which costs the rest of its sequence (67% of Qwen3's positions on lavapipe once, with
/// ggml's MXFP4 weights).
const FP4: [(&str, f64); 3] = [("w4a4-mxfp4", 0.6), ("w4a4-mxfp4+kv-fp8-e4m3", 0.6), ("w4a4-nvfp4+kv-fp8-e4m3", 0.6)];

#[test]
fn qwen3_fp4_variants_match_the_f64_forward_pass() {
    variants_match_on("qwen3", &FP4, BackendChoice::Cpu);
    variants_match_on("qwen3", &FP4, BackendChoice::Wgpu);
}

#[test]
fn qwen3_moe_fp4_variants_match_the_f64_forward_pass() {
    variants_match_on("qwen3_moe", &FP4, BackendChoice::Cpu);
    variants_match_on("qwen3_moe", &FP4, BackendChoice::Wgpu);
}
