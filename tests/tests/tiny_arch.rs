//! The tiny-arch checkpoints (`../shared/models/tiny-arch/<arch>/`, see its README) against
//! `transformers`' float64 goldens: one random bf16 checkpoint per architecture beyond Llama
//! (Qwen3, Qwen3-MoE, Gemma 2, Gemma 3, Phi-3, Mixtral, gpt-oss; SmolLM3, Llama 4, GLM-4.5),
//! opened with `open_model`.
//!
//! For each, one test checks that
//! - the tokenizer encodes `golden.json`'s `texts` to its `prompts`;
//! - the independent f64 forward pass (`qdrift_tests::reference64`), teacher-forced on
//!   `golden_logits.safetensors`' `tokens`, gives its `logits` (f64 rounded to f32) within
//!   [`REFERENCE_TOLERANCE`];
//! - the Burn model in f32, on the CPU backend (host kernels where they apply) and on wgpu
//!   (Mesa's lavapipe without a GPU), decodes the 40 greedy tokens of each prompt exactly, the
//!   three prompts in one left-padded batch as the evaluation decodes them, and its
//!   teacher-forced logits (the prompt in one pass, then chunks of 7 through the KV cache, so
//!   that the sliding windows reach across passes) agree with the golden ones within
//!   [`MODEL_TOLERANCE`];
//! - the model in bf16 (`--dtype bf16`, CPU) stays within [`BF16_TOLERANCE`] of the logits' scale
//!   (see there for mixtures of experts, whose routing bf16 may change).
//!
//! Every check prints its max |Δlogit|.

use std::path::{Path, PathBuf};

use burn::tensor::{DType, Int, Tensor, TensorData};
use qdrift_generate::{BackendChoice, ComputeDevice};
use qdrift_load::{HostModel, Routing};
use qdrift_load::{LoadedModel, open_model};
use qdrift_model::{Llama, Positions};
use qdrift_tests::reference64::{Rounding, naive_logits};
use qdrift_tests::{device, run_greedy, shared_dir};

/// The f64 reference against the f64 goldens rounded to f32 (the goldens' own rounding is up to
/// half an f32 ulp, ~2e-7 for logits of order 1; transformers computes RoPE's angles and the
/// softmax of attention and routers in f32 even in a float64 model).
const REFERENCE_TOLERANCE: f64 = 1e-5;

/// The f32 model against the goldens (issue #30).
const MODEL_TOLERANCE: f64 = 1e-4;

/// The new tokens of each golden greedy run.
const NEW_TOKENS: usize = 40;

/// One architecture's goldens.
struct Golden {
    texts: Vec<String>,
    prompts: Vec<Vec<u32>>,
    greedy: Vec<Vec<u32>>,
    /// Prompt 0 and its greedy continuation.
    tokens: Vec<u32>,
    /// Teacher-forced logits of `tokens`, `[position][vocab]`.
    logits: Vec<Vec<f32>>,
}

fn arch_dir(arch: &str) -> PathBuf {
    shared_dir().join("models/tiny-arch").join(arch)
}

fn id_lists(v: &serde_json::Value, what: &str) -> Vec<Vec<u32>> {
    let list = v[what].as_array().unwrap_or_else(|| panic!("golden.json: {what} is a list"));
    list.iter()
        .map(|p| {
            let ids = p.as_array().unwrap_or_else(|| panic!("golden.json: {what} holds lists"));
            ids.iter().map(|t| u32::try_from(t.as_u64().expect("token id")).expect("id fits u32")).collect()
        })
        .collect()
}

/// A safetensors file's tensors by name: dtype, shape and bytes (the format: an 8-byte
/// little-endian header length, a JSON header of `{name: {dtype, shape, data_offsets}}`, the
/// data).
fn safetensors(path: &Path) -> Vec<(String, String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).expect("header is JSON");
    let data = &bytes[8 + n..];
    let object = header.as_object().expect("header is an object");
    object
        .iter()
        .filter(|(name, _)| *name != "__metadata__")
        .map(|(name, t)| {
            let dtype = t["dtype"].as_str().expect("dtype").to_string();
            let shape =
                t["shape"].as_array().expect("shape").iter().map(|d| d.as_u64().expect("dim") as usize).collect();
            let off = t["data_offsets"].as_array().expect("offsets");
            let (a, b) = (off[0].as_u64().expect("offset") as usize, off[1].as_u64().expect("offset") as usize);
            (name.clone(), dtype, shape, data[a..b].to_vec())
        })
        .collect()
}

fn golden(arch: &str) -> Golden {
    let dir = arch_dir(arch);
    let path = dir.join("golden.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let json: serde_json::Value = serde_json::from_str(&text).expect("golden.json is JSON");
    let texts = json["texts"].as_array().expect("texts").iter().map(|t| t.as_str().expect("text").to_string());
    let (mut tokens, mut logits) = (Vec::new(), Vec::new());
    for (name, dtype, shape, bytes) in safetensors(&dir.join("golden_logits.safetensors")) {
        match (name.as_str(), dtype.as_str()) {
            ("tokens", "I64") => {
                tokens = bytes
                    .chunks_exact(8)
                    .map(|b| u32::try_from(i64::from_le_bytes(b.try_into().expect("8 bytes"))).expect("token id"))
                    .collect();
            }
            ("logits", "F32") => {
                let values: Vec<f32> =
                    bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
                logits = values.chunks(shape[1]).map(<[f32]>::to_vec).collect();
            }
            other => panic!("unexpected tensor {other:?} in golden_logits.safetensors"),
        }
    }
    assert_eq!(tokens.len(), logits.len(), "{arch}: one logit row per token");
    Golden {
        texts: texts.collect(),
        prompts: id_lists(&json, "prompts"),
        greedy: id_lists(&json, "greedy"),
        tokens,
        logits,
    }
}

fn max_abs<T: Copy + Into<f64>>(got: &[Vec<T>], want: &[Vec<f32>]) -> f64 {
    assert_eq!(got.len(), want.len(), "positions");
    got.iter()
        .zip(want)
        .flat_map(|(g, w)| {
            assert_eq!(g.len(), w.len(), "vocabulary");
            g.iter().zip(w).map(|(&g, &w)| (g.into() - f64::from(w)).abs())
        })
        .fold(0.0, f64::max)
}

fn ids(tokens: &[u32], dev: &ComputeDevice) -> Tensor<2, Int> {
    let data: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
    Tensor::from_data(TensorData::new(data, [1, tokens.len()]), &dev.device)
}

/// Teacher-forced logits of every position: `prompt` tokens in one pass, then chunks of 7
/// through the KV cache.
fn model_logits(model: &Llama, dev: &ComputeDevice, tokens: &[u32], prompt: usize) -> Vec<Vec<f32>> {
    let positions = Positions::left_padded(&[tokens.len()]);
    let mut caches = model.new_caches(1, tokens.len());
    let mut out = Vec::new();
    let chunks = std::iter::once(&tokens[..prompt]).chain(tokens[prompt..].chunks(7));
    for chunk in chunks {
        let logits = model.forward(ids(chunk, dev), &positions, &mut caches, true);
        let [_, t, v] = logits.dims();
        let data = logits.into_data().try_into_vec::<f32>().expect("f32 logits");
        out.extend((0..t).map(|i| data[i * v..(i + 1) * v].to_vec()));
    }
    out
}

/// The Burn model on `choice`: greedy tokens of the three prompts in one batch, and
/// teacher-forced logits; returns their max |Δlogit| against the goldens.
fn check_model(arch: &str, loaded: &LoadedModel, g: &Golden, choice: BackendChoice) -> f64 {
    let dev = device(choice);
    let start = std::time::Instant::now();
    let (tokens, first) = run_greedy(loaded, &dev, DType::F32, &g.prompts, NEW_TOKENS, g.prompts.len());
    let decoding = start.elapsed().as_secs_f64();
    for (i, (got, want)) in tokens.iter().zip(&g.greedy).enumerate() {
        let first_diff = got.iter().zip(want).position(|(a, b)| a != b);
        assert_eq!(first_diff, None, "{arch} on {}: prompt {i}'s greedy tokens diverge at {first_diff:?}", dev.adapter);
        assert_eq!(got.len(), want.len(), "{arch} on {}: prompt {i}'s greedy length", dev.adapter);
    }
    // Prompt 0 is the shortest but one of the batch: its first step ran left-padded.
    let padded = max_abs(&first[..1], &g.logits[g.prompts[0].len() - 1..][..1]);
    let model = Llama::from_host(&loaded.model, DType::F32, &dev.device).expect("model builds");
    let start = std::time::Instant::now();
    let logits = model_logits(&model, &dev, &g.tokens, g.prompts[0].len());
    let err = max_abs(&logits, &g.logits).max(padded);
    println!(
        "{arch}: model in f32 on {}: greedy tokens equal ({decoding:.1} s); teacher-forced max |Δlogit| {err:.2e} \
         ({:.1} s; left-padded first step {padded:.2e})",
        dev.adapter,
        start.elapsed().as_secs_f64()
    );
    assert!(err <= MODEL_TOLERANCE, "{arch} on {}: logits differ from the golden by up to {err:.2e}", dev.adapter);
    err
}

/// The bf16 model (`--dtype bf16`, CPU) against the goldens, per position, relative to the
/// largest |logit|: bf16 keeps 8 significant bits (a relative step of 2⁻⁸ = 3.9e-3) and every
/// operation of every layer rounds to it, so the logits of these random-weight models move by a
/// few steps of their scale. Dense models stay within it at every position (measured: 2.0–3.2%).
/// A mixture of experts routes a token to another expert where two router logits are within
/// bf16's rounding of each other, which moves that position's logits by far more (measured: up
/// to 22–32%) and the later positions a little; there [`BF16_MOE_WITHIN`] of the positions must
/// be within it, and the worst position must be one whose routing differs from the f32 model's.
const BF16_TOLERANCE: f64 = 0.05;

/// Share of a mixture of experts' positions within [`BF16_TOLERANCE`] (measured: 73% for
/// Mixtral and gpt-oss, 97% for Qwen3-MoE, 98% for Llama 4, 85% for GLM-4.5).
const BF16_MOE_WITHIN: f64 = 0.7;

/// The model in bf16 on the CPU: teacher-forced logits against the goldens, per position within
/// [`BF16_TOLERANCE`] of their scale (all of them; for a mixture of experts
/// [`BF16_MOE_WITHIN`] of them, the worst where routing differs from f32), and farther from the
/// goldens than the f32 model.
fn check_bf16(arch: &str, loaded: &LoadedModel, g: &Golden) {
    let dev = device(BackendChoice::Cpu);
    let mut weights = loaded.model.clone();
    qdrift_quantize::round_to_reference(&mut weights, qdrift_quantize::ReferenceFormat::Bf16);
    let model = Llama::from_host(&weights, DType::BF16, &dev.device).expect("bf16 model builds");
    let logits = model_logits(&model, &dev, &g.tokens, g.prompts[0].len());
    let scale = g.logits.iter().flatten().fold(0.0f64, |m, &v| m.max(f64::from(v).abs()));
    let errors: Vec<f64> = logits
        .iter()
        .zip(&g.logits)
        .map(|(got, want)| max_abs(std::slice::from_ref(got), std::slice::from_ref(want)) / scale)
        .collect();
    let worst = (0..errors.len()).max_by(|&a, &b| errors[a].total_cmp(&errors[b])).expect("positions");
    let within = errors.iter().filter(|&&e| e <= BF16_TOLERANCE).count() as f64 / errors.len() as f64;
    let f32_model = Llama::from_host(&weights, DType::F32, &dev.device).expect("f32 model builds");
    let f32_err = max_abs(&model_logits(&f32_model, &dev, &g.tokens, g.prompts[0].len()), &g.logits) / scale;
    println!(
        "{arch}: model in bf16: teacher-forced max |Δlogit| / max |logit| {:.2e} (position {worst}), {:.0}% of {} \
         positions within {BF16_TOLERANCE} (f32: {f32_err:.2e})",
        errors[worst],
        100.0 * within,
        errors.len()
    );
    assert!(errors[worst] > f32_err, "{arch} in bf16: no farther from the golden than f32: did it round at all?");
    if loaded.model.arch.moe.is_none() {
        assert_eq!(within, 1.0, "{arch} in bf16: a position is beyond {BF16_TOLERANCE} of the golden");
        return;
    }
    assert!(within >= BF16_MOE_WITHIN, "{arch} in bf16: {:.0}% of positions within {BF16_TOLERANCE}", 100.0 * within);
    // Routes of every position after the first (one token of prompt, the rest forced), per layer.
    let sequence = [(g.tokens[..1].to_vec(), g.tokens[1..].to_vec())];
    let n = g.tokens.len() - 1;
    let routes = |m: &Llama| {
        let mut r = qdrift_tests::recorded_routes(m, &sequence, n, 7).remove(0);
        r.iter_mut().flatten().for_each(|experts| experts.sort_unstable());
        r
    };
    let (bf16_routes, f32_routes) = (routes(&model), routes(&f32_model));
    // Row `j` of the routes is position `j`'s (the forced pass predicts token `j + 1` there).
    let rerouted = |j: usize| bf16_routes.iter().zip(&f32_routes).any(|(a, b)| a[j] != b[j]);
    assert!(
        errors[worst] <= BF16_TOLERANCE || rerouted(worst),
        "{arch} in bf16: the worst position ({worst}, {:.2e}) routes as the f32 model does",
        errors[worst]
    );
}

const ARCHS: [&str; 10] =
    ["qwen3", "qwen3_moe", "gemma2", "gemma3", "phi3", "mixtral", "gpt_oss", "smollm3", "llama4", "glm4_moe"];

fn open(arch: &str) -> LoadedModel {
    let dir = arch_dir(arch);
    open_model(&dir, None).unwrap_or_else(|e| panic!("{arch} must load from {}: {e}", dir.display()))
}

/// The tokenizer's ids and the f64 reference's logits against the goldens.
fn check_reference(arch: &str, loaded: &LoadedModel, g: &Golden) -> f64 {
    for (text, want) in g.texts.iter().zip(&g.prompts) {
        assert_eq!(&loaded.tokenizer.encode(text), want, "{arch}: tokens of {text:?}");
    }
    assert_eq!(g.tokens[..g.prompts[0].len()], g.prompts[0], "{arch}: the logits' sequence starts with prompt 0");
    let reference = naive_logits(&loaded.model, &g.tokens, &Rounding::default());
    let err = max_abs(&reference, &g.logits);
    println!("{arch}: f64 reference: teacher-forced max |Δlogit| {err:.2e}");
    assert!(err <= REFERENCE_TOLERANCE, "{arch}: the f64 reference's logits differ by up to {err:.2e}");
    err
}

/// The reference on its own, for every architecture, whatever the model supports.
#[test]
fn the_f64_reference_matches_every_golden() {
    for arch in ARCHS {
        check_reference(arch, &open(arch), &golden(arch));
    }
}

fn check(arch: &str) {
    let (loaded, g) = (open(arch), golden(arch));
    check_reference(arch, &loaded, &g);
    check_model(arch, &loaded, &g, BackendChoice::Cpu);
    check_model(arch, &loaded, &g, BackendChoice::Wgpu);
    check_bf16(arch, &loaded, &g);
}

#[test]
fn qwen3() {
    check("qwen3");
}

#[test]
fn qwen3_moe() {
    check("qwen3_moe");
}

#[test]
fn gemma2() {
    check("gemma2");
}

#[test]
fn gemma3() {
    check("gemma3");
}

#[test]
fn phi3() {
    check("phi3");
}

#[test]
fn mixtral() {
    check("mixtral");
}

#[test]
fn gpt_oss() {
    check("gpt_oss");
}

/// A change to a model's description.
type Edit = fn(&mut HostModel);

/// Each feature matters: the f64 reference without it moves past `at_least` from the goldens.
fn features_matter(arch: &str, host: &HostModel, edits: &[(&str, Edit)], at_least: f64) {
    let g = golden(arch);
    for (what, edit) in edits {
        let mut changed = host.clone();
        edit(&mut changed);
        let err = max_abs(&naive_logits(&changed, &g.tokens, &Rounding::default()), &g.logits);
        println!("{arch} with {what}: max |Δlogit| {err:.2e}");
        assert!(err > at_least, "{arch} with {what}: {err:.2e}");
    }
}

/// NoPE on every 4th layer (`no_rope_layers` `[1, 1, 1, 0]`), tied embeddings.
#[test]
fn smollm3() {
    let loaded = open("smollm3");
    let a = &loaded.model.arch;
    assert_eq!((a.layer_attention.rope.as_slice(), a.tied_embeddings), (&[true, true, true, false][..], true));
    check("smollm3");
    features_matter(
        "smollm3",
        &loaded.model,
        &[("RoPE on every layer", |m| m.arch.layer_attention.rope.clear())],
        1e-2,
    );
}

/// Chunked attention (chunk 16) on layers 0–2, a global NoPE layer 3 with attention temperature,
/// L2 q/k norm, experts (4, top-1 sigmoid scaling inputs, ungated shared expert) on layers 1 and 3.
#[test]
fn llama4() {
    let loaded = open("llama4");
    let (a, la) = (&loaded.model.arch, &loaded.model.arch.layer_attention);
    assert_eq!(la.chunks, [Some(16), Some(16), Some(16), None]);
    assert_eq!((la.qk_l2_norm, la.rope.as_slice()), (Some(1e-6), &[true, true, true, false][..]));
    assert_eq!(a.moe.as_ref().map(|m| (m.dense_layers.clone(), m.routing)), Some((vec![0, 2], Routing::SigmoidInput)));
    check("llama4");
    let edits: [(&str, Edit); 4] = [
        ("no chunks", |m| m.arch.layer_attention.chunks.clear()),
        ("no L2 norm", |m| m.arch.layer_attention.qk_l2_norm = None),
        ("no temperature", |m| m.arch.layer_attention.temperature = None),
        ("weights on the outputs", |m| {
            m.arch.moe.as_mut().expect("experts").routing = Routing::SoftmaxTopK { renormalize: false };
        }),
    ];
    features_matter("llama4", &loaded.model, &edits, 1e-3);
}

/// q/k/v biases, q/k norms, partial rotary 0.5, layer 0 dense, 8 experts (top-2 of sigmoid
/// scores chosen with `e_score_correction_bias`, renormalized, ×1.5) and an ungated shared expert.
#[test]
fn glm4_moe() {
    let loaded = open("glm4_moe");
    let a = &loaded.model.arch;
    assert_eq!((a.block.rotary_dim, a.block.qk_norm), (Some(8), true));
    let grouped = Routing::GroupedSigmoid { n_group: 1, topk_group: 1, renormalize: true, scale: 1.5 };
    assert_eq!(
        a.moe.as_ref().map(|m| (m.dense_layers.clone(), m.routing, m.shared_expert_hidden)),
        Some((vec![0], grouped, Some(32)))
    );
    check("glm4_moe");
    let edits: [(&str, Edit); 2] = [
        ("no routed_scaling_factor", |m| {
            m.arch.moe.as_mut().expect("experts").routing =
                Routing::GroupedSigmoid { n_group: 1, topk_group: 1, renormalize: true, scale: 1.0 };
        }),
        ("softmax routing", |m| {
            m.arch.moe.as_mut().expect("experts").routing = Routing::SoftmaxTopK { renormalize: true };
        }),
    ];
    features_matter("glm4_moe", &loaded.model, &edits, 1e-3);
}
