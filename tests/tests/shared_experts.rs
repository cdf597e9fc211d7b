//! Qwen2-MoE's shared expert (`Qwen2MoeSparseMoeBlock`: `Σ_e w_e·expert_e(x) + σ(g·x)·shared(x)`)
//! on a tiny random `Qwen2MoeForCausalLM` checkpoint written by `qdrift_tests::qwen2_moe` (no
//! `transformers`-written one is in `../shared/`), against the independent f64 forward pass
//! (`qdrift_tests::reference64`, which follows `modeling_qwen2_moe.py`):
//! - the checkpoint reads as `Qwen2MoeConfig` says (shared expert width, routing without
//!   `norm_topk_prob`, q/k/v biases, dense `mlp_only_layers`), and through GGUF `qwen2moe` back
//!   to the same model;
//! - teacher-forced logits on every kernel combination of the CPU backend and on wgpu agree with
//!   the f64 pass within [`AGREE`], and greedy decoding of three prompts in one left-padded batch
//!   picks the f64 pass's best token on both backends; the shared expert and its gate count
//!   (the logits move far past [`AGREE`] without either);
//! - the routes the evaluation records are the f64 router's;
//! - the shared expert's projections are quantized with the experts, its gate kept at reference
//!   precision with the router unless `quantize_router`;
//! - int8, W8A8-FP8 and a KV scheme evaluate end to end, with routing metrics for every variant.

use std::cell::RefCell;

use burn::tensor::{DType, Device};
use qdrift_eval::{EvalConfig, VariantSpec, evaluate};
use qdrift_generate::{BackendChoice, ComputeDevice, GenerationConfig, generate};
use qdrift_load::write::{WriteDtype, gguf_tokenizer_keys, write_gguf_with};
use qdrift_load::{HostModel, Routing, open_model};
use qdrift_model::{AttentionKernel, LinearKernel, Llama};
use qdrift_quantize::{QuantizeOptions, Scheme, quantize_model};
use qdrift_tests::reference64::{Rounding, naive_logits};
use qdrift_tests::{QWEN2_MOE_SHARED, cached_logits, device, qwen2_moe, recorded_routes, tiny_arch_prompts};

/// Largest |Δlogit| allowed against the f64 pass (issue #30's model tolerance).
const AGREE: f64 = 1e-4;

/// The golden prompts of the tiny-arch Qwen3-MoE, whose tokenizer the fixture shares.
fn prompts() -> Vec<Vec<u32>> {
    tiny_arch_prompts("qwen3_moe")
}

/// The fixture, written into a fresh directory, and its model.
fn fixture(mlp_only_layers: &[usize]) -> (tempfile::TempDir, HostModel) {
    let dir = tempfile::tempdir().expect("tempdir");
    qwen2_moe(dir.path(), mlp_only_layers);
    let model = open_model(dir.path(), None).unwrap_or_else(|e| panic!("the Qwen2-MoE fixture opens: {e}")).model;
    (dir, model)
}

fn max_abs<T: Copy + Into<f64>>(got: &[Vec<f32>], want: &[Vec<T>]) -> f64 {
    assert_eq!(got.len(), want.len(), "positions");
    got.iter().flatten().zip(want.iter().flatten()).fold(0.0, |m, (&g, &w)| m.max((f64::from(g) - w.into()).abs()))
}

fn max_abs64(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    a.iter().flatten().zip(b.iter().flatten()).fold(0.0, |m, (x, y)| m.max((x - y).abs()))
}

#[test]
fn the_checkpoint_reads_as_its_config_says_and_through_gguf_unchanged() {
    let (_dir, m) = fixture(&[]);
    let moe = m.arch.moe.as_ref().expect("experts");
    assert_eq!(m.arch.architecture, "Qwen2MoeForCausalLM");
    assert_eq!((moe.n_experts, moe.top_k, moe.expert_hidden), (8, 2, 32));
    assert_eq!(moe.shared_expert_hidden, Some(QWEN2_MOE_SHARED));
    assert_eq!(moe.routing, Routing::SoftmaxTopK { renormalize: false });
    assert!(m.arch.windows.is_empty() && !m.arch.block.qk_norm && !m.arch.tied_embeddings);
    for l in &m.layers {
        assert!(l.bq.is_some() && l.bk.is_some() && l.bv.is_some() && l.bo.is_none());
        let sh = l.experts().expect("experts").shared.as_ref().expect("a shared expert");
        assert_eq!((sh.mlp.gate.shape.as_slice(), sh.mlp.down.shape.as_slice()), (&[96, 64][..], &[64, 96][..]));
        assert_eq!(sh.gate.shape, [1, 64]);
    }
    // What the architecture implies is what the checkpoint holds, less the q/k/v biases.
    assert_eq!(m.arch.parameter_count() + 3 * (64 + 32 + 32), m.parameter_count());
    let names: Vec<String> = m.layers[0].linears().iter().map(|(n, _)| n.to_string()).collect();
    assert!(names.contains(&"mlp.shared_expert.down_proj".to_string()), "{names:?}");

    let (_d, dense) = fixture(&[1]);
    assert_eq!(dense.arch.moe.as_ref().expect("experts").dense_layers, [1]);
    assert!(dense.layers[1].mlp().is_some() && dense.layers[0].experts().is_some());

    // GGUF qwen2moe (`qwen2moe.cpp`): back to the same model, bit for bit.
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("qwen2moe.gguf");
    let keys = gguf_tokenizer_keys(&open_model(_dir.path(), None).expect("opens")).expect("tokenizer keys");
    write_gguf_with(&path, &m, &keys, WriteDtype::F32, &|_| None).expect("qwen2moe writes as GGUF");
    let back = open_model(&path, None).expect("the GGUF reads").model;
    assert_eq!(back.arch.architecture, "qwen2moe");
    assert_eq!(back.arch.moe, m.arch.moe);
    assert_eq!(back.layers, m.layers, "every layer's weights");
    assert_eq!((&back.token_embedding, &back.output), (&m.token_embedding, &m.output));
    // A layer without experts has no place in llama.cpp's qwen2moe.
    let e = write_gguf_with(&tmp.path().join("dense.gguf"), &dense, &keys, WriteDtype::F32, &|_| None)
        .expect_err("refused");
    assert!(e.to_string().contains("dense FFN layers [1]"), "{e}");
}

#[test]
fn logits_match_the_f64_pass_on_both_backends_and_the_shared_expert_counts() {
    let (_dir, m) = fixture(&[1]);
    let p = prompts();
    let tokens = [p[0].clone(), p[2].clone()].concat();
    let want = naive_logits(&m, &tokens, &Rounding::default());
    for linear in [LinearKernel::Burn, LinearKernel::Host] {
        let model = Llama::from_host_with(&m, DType::F32, &Device::flex(), linear).expect("model builds");
        for kernel in [AttentionKernel::Composed, AttentionKernel::Host] {
            let err = max_abs(&cached_logits(&model, &Device::flex(), &tokens, (p[0].len(), 1), kernel), &want);
            println!("qwen2_moe, CPU, {linear:?} linear, {kernel:?} attention: max |Δlogit| {err:.2e}");
            assert!(err <= AGREE, "CPU {linear:?}/{kernel:?}: max |Δlogit| {err:.2e}");
        }
    }
    let gpu = device(BackendChoice::Wgpu);
    let model = Llama::from_host(&m, DType::F32, &gpu.device).expect("model builds");
    let err = max_abs(&cached_logits(&model, &gpu.device, &tokens, (p[0].len(), 7), AttentionKernel::Composed), &want);
    println!("qwen2_moe, wgpu ({}): max |Δlogit| {err:.2e}", gpu.adapter);
    assert!(err <= AGREE, "wgpu: max |Δlogit| {err:.2e}");

    // Without the shared expert's output, or with its gate open (σ = 1/2 everywhere), the f64
    // pass moves far past the tolerance: both are computed.
    let mut silent = m.clone();
    let mut open = m.clone();
    for (s, o) in silent.layers.iter_mut().zip(&mut open.layers) {
        if let (qdrift_load::Ffn::Experts(s), qdrift_load::Ffn::Experts(o)) = (&mut s.ffn, &mut o.ffn) {
            s.shared.as_mut().expect("shared").mlp.down.data.fill(0.0);
            o.shared.as_mut().expect("shared").gate.data.fill(0.0);
        }
    }
    let silent = max_abs64(&naive_logits(&silent, &tokens, &Rounding::default()), &want);
    let open = max_abs64(&naive_logits(&open, &tokens, &Rounding::default()), &want);
    println!("without the shared expert: max |Δlogit| {silent:.3}; gate at 1/2: {open:.3}");
    assert!(silent > 1000.0 * AGREE && open > 1000.0 * AGREE, "{silent:.2e}, {open:.2e}");
}

/// Greedy decoding of the three prompts in one left-padded batch on `dev`: each new token must be
/// the f64 pass's best within [`AGREE`].
fn greedy_picks_the_f64_best(m: &HostModel, dev: &ComputeDevice) {
    let p = prompts();
    let model = Llama::from_host(m, DType::F32, &dev.device).expect("model builds");
    let n = 16;
    let config = GenerationConfig { max_new_tokens: n, batch_size: p.len(), stop_at_eos: None };
    let out = generate(&model, dev, &p, &config, |_| {}).expect("decodes");
    for (i, (prompt, new)) in p.iter().zip(&out).enumerate() {
        let seq = [prompt.clone(), new[..n - 1].to_vec()].concat();
        let want = naive_logits(m, &seq, &Rounding::default());
        for (k, &t) in new.iter().enumerate() {
            let row = &want[prompt.len() - 1 + k];
            let best = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            assert!(row[t as usize] >= best - AGREE, "{}: prompt {i}, new token {k}: {t} is not the best", dev.adapter);
        }
    }
}

#[test]
fn greedy_decoding_picks_the_f64_best_on_both_backends() {
    let (_dir, m) = fixture(&[]);
    for choice in [BackendChoice::Cpu, BackendChoice::Wgpu] {
        greedy_picks_the_f64_best(&m, &device(choice));
    }
}

#[test]
fn recorded_routes_are_the_f64_routers_choices() {
    let (_dir, m) = fixture(&[1]);
    let dev = device(BackendChoice::Cpu);
    let model = Llama::from_host(&m, DType::F32, &dev.device).expect("model");
    let p = prompts();
    let n = 10;
    let config = GenerationConfig { max_new_tokens: n, batch_size: 2, stop_at_eos: None };
    let continuations = generate(&model, &dev, &p, &config, |_| {}).expect("generation");
    let sequences: Vec<(Vec<u32>, Vec<u32>)> = p.iter().cloned().zip(continuations).collect();
    let recorded = recorded_routes(&model, &sequences, n, 4);
    assert_eq!(recorded[0].len(), 2, "layers 0 and 2 have experts");
    let mut compared = 0;
    for (i, (prompt, c)) in sequences.iter().enumerate() {
        let routes = RefCell::new(Vec::new());
        let tokens: Vec<u32> = prompt.iter().chain(c).copied().collect();
        naive_logits(&m, &tokens, &Rounding { routes: Some(&routes), ..Default::default() });
        for (l, layer) in routes.into_inner().iter().enumerate() {
            for t in 0..n {
                let want: Vec<u32> = layer[prompt.len() - 1 + t].iter().map(|&e| e as u32).collect();
                assert_eq!(recorded[i][l][t], want, "prompt {i} layer {l} position {t}");
                compared += 1;
            }
        }
    }
    println!("qwen2_moe: {compared} (prompt, layer, position) routes equal to the f64 router's");
    assert_eq!(compared, 3 * 2 * n);
}

#[test]
fn the_shared_expert_is_quantized_and_its_gate_kept_with_the_router() {
    let (_dir, m) = fixture(&[]);
    let scheme: Scheme = "int4-g32".parse().expect("scheme");
    let shared = |q: &HostModel| q.layers[0].experts().expect("experts").shared.clone().expect("shared");
    let kept = quantize_model(&m, &scheme, &QuantizeOptions::default()).expect("quantizes");
    let (before, after) = (shared(&m), shared(&kept.dequantized));
    assert_ne!(before.mlp.gate, after.mlp.gate, "the shared expert's projections are quantized");
    assert_ne!(before.mlp.down, after.mlp.down);
    assert_eq!(before.gate, after.gate, "its gate stays at reference precision");
    let names: Vec<&str> = kept.tensors.iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"model.layers.0.mlp.shared_expert.up_proj.weight"), "{names:?}");
    assert!(!names.iter().any(|n| n.contains("shared_expert_gate")));

    let opts = QuantizeOptions { quantize_router: true, ..Default::default() };
    let rounded = quantize_model(&m, &scheme, &opts).expect("quantizes");
    assert_ne!(shared(&rounded.dequantized).gate, before.gate, "--quantize-router rounds the gate too");
    assert!(rounded.tensors.iter().any(|t| t.name == "model.layers.2.mlp.shared_expert_gate.weight"));
}

#[test]
fn int8_w8a8_fp8_and_a_kv_scheme_evaluate_with_routing_metrics() {
    let (dir, _) = fixture(&[]);
    let mut cfg = EvalConfig::new(dir.path().to_path_buf());
    cfg.prompts = Some(3);
    cfg.horizons = vec![10];
    cfg.batch_size = Some(3);
    cfg.resamples = 100;
    cfg.backend = BackendChoice::Cpu;
    let schemes = ["int8", "w8a8-fp8", "int8+kv-q8_0"];
    cfg.variants = schemes.iter().map(|s| VariantSpec::Scheme(s.parse().expect("scheme"))).collect();
    let report = evaluate(&cfg, &mut |_| {}).expect("evaluation");
    assert_eq!(report.variants.len(), schemes.len() + 1, "the noise floor and three schemes");
    for v in &report.variants {
        let h = &v.horizons[0];
        let (tm, flips) = (h.metric("token_match_rate").expect("tm").mean, h.metric("routing_flip_rate"));
        let flips = flips.unwrap_or_else(|| panic!("{}: routing_flip_rate", v.name)).mean;
        let r = v.routing.as_ref().unwrap_or_else(|| panic!("{}: routing", v.name));
        assert_eq!((r.experts, r.top_k, r.layers.len()), (8, 2, 3), "{}", v.name);
        assert!((0.0..=1.0).contains(&tm) && (0.0..=1.0).contains(&flips), "{}: {tm} {flips}", v.name);
        println!("qwen2_moe {}: token match {tm:.3}, routing flips {flips:.4}", v.name);
    }
}
