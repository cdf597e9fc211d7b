//! What one decode step launches on wgpu (lavapipe here), counted by `timed_generate`: a
//! regression guard for issue #33's launch budget. Its own test binary, because the launch
//! counter is process-wide and other tests' kernels would be counted with it.
//!
//! SmolLM2-135M's shapes (dim 576, hidden 1536, 9/3 heads of 64, vocab 49152, tied) with two of
//! its 30 layers and seeded random weights, computed in f16: 2 prompts × 6 new tokens, batch 2.

use burn::tensor::DType;
use qdrift_generate::{BackendChoice, GenerationConfig, timed_generate};
use qdrift_load::{HostModel, synthetic_model};
use qdrift_model::Llama;
use qdrift_tests::device;

/// `host` cut to its first `layers` layers.
fn first_layers(host: &mut HostModel, layers: usize) {
    host.layers.truncate(layers);
    host.arch.n_layers = layers;
}

/// One decode step's launches by kernel, and in all.
fn decode_step(host: &HostModel) -> (std::collections::BTreeMap<String, u64>, f64) {
    let device = device(BackendChoice::Wgpu);
    let model = Llama::from_host(host, DType::F16, &device.device).expect("model builds");
    let prompts = vec![vec![5, 17, 301, 9], vec![44, 2, 873]];
    let config = GenerationConfig { max_new_tokens: 6, batch_size: 2, stop_at_eos: None };
    let (_, t) = timed_generate(&model, &device, &prompts, &config).expect("times");
    assert_eq!(t.decode_step_read_back_bytes, Some(8.0), "two token ids per step");
    (t.decode_step_kernels.by_kernel, t.decode_step_launches.expect("a decode step"))
}

#[test]
fn a_decode_step_on_wgpu_copies_nothing_and_launches_one_matmul_per_product() {
    // Generated once (all 30 layers), then cut to 2 layers and to 1.
    let mut host = synthetic_model("smollm2-135m", 7).expect("preset").model;
    first_layers(&mut host, 2);
    let (kernels, total) = decode_step(&host);
    println!("decode step, 2 layers: {total} launches, {kernels:?}");
    // Each projection reads its stored weight in place (no relayout copy of any operand), and
    // RoPE takes no strided slice (a copy kernel each).
    let copies: Vec<_> = kernels.keys().filter(|k| k.contains("Copy") || k.as_str() == "SliceKernel").collect();
    assert!(copies.is_empty(), "a decode step copies operands: {kernels:?}");
    // RoPE swaps each pair with a `select` fused into its products, not a `flip` kernel.
    assert!(!kernels.contains_key("FlipKernel"), "RoPE's swap is a kernel of its own: {kernels:?}");
    // Per layer: q/k/v stacked, scores, weights × values, o, gate/up stacked, down; and the
    // output head.
    assert_eq!(kernels.get("MatmulEntry"), Some(&13), "{kernels:?}");
    // One layer's launches: the difference a second layer makes (the same kernels, tuned already).
    first_layers(&mut host, 1);
    let (_, one) = decode_step(&host);
    let per_layer = total - one;
    println!("one layer: {per_layer} launches");
    // 12 measured (docs/BENCHMARKS.md, 2026-12-06); 70 without fusion. Which blocks fusion forms,
    // and which candidate autotune times fastest (a fused matmul or its fallback, a matmul plus a
    // fused elementwise kernel), can differ with the machine and its load, hence the room; the
    // exact guards are above.
    assert!(per_layer <= 15.0, "{per_layer} launches per layer: {kernels:?}");
}
