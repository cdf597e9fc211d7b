//! The real-size synthetic presets (`qwen3-8b`, `qwen3-30b-a3b`, `gemma3-12b`, `gpt-oss-20b`,
//! each its published `config.json` read by the Hugging Face reader) at test size: each builds
//! as a model on the CPU backend, with every feature its preset carries (q/k and sandwich norms,
//! `(1 + w)` norms, sliding windows, YaRN, sinks, biases, experts), and its teacher-forced
//! logits agree with the independent f64 forward pass (`qdrift_tests::reference64`) to 1e-5 of
//! their scale. Their full sizes (16–61 GB in f16) run only on a GPU (`cargo xtask bench gpu`).

use burn::tensor::{DType, Device};
use qdrift_load::{HostModel, WeightSource};
use qdrift_model::{AttentionKernel, Llama};
use qdrift_tests::reference64::{Rounding, naive_logits};

#[test]
fn every_real_size_preset_runs_at_test_size_as_the_f64_pass_does() {
    for name in ["qwen3-8b", "qwen3-30b-a3b", "gemma3-12b", "gpt-oss-20b"] {
        let source = qdrift_load::synthetic_source(name, 9).expect(name).model.resized(|a| {
            (a.n_layers, a.dim, a.hidden_dim, a.n_heads, a.n_kv_heads, a.head_dim, a.vocab_size) =
                (2, 32, 16, 4, 2, 8, 300);
            a.windows.truncate(2);
            if let Some(m) = &mut a.moe {
                (m.n_experts, m.top_k, m.expert_hidden) = (4, 2, 8);
            }
        });
        let host = HostModel::from_source(&source).expect("parts");
        assert_eq!(host.parameter_count(), source.parameter_count(), "{name}");
        let device = Device::flex();
        let model = Llama::from_source(&source, DType::F32, &device).unwrap_or_else(|e| panic!("{name}: {e}"));
        let tokens: Vec<u32> = (0..12).map(|i| (i * 37 + 5) % 300).collect();
        let got = qdrift_tests::cached_logits(&model, &device, &tokens, (6, 3), AttentionKernel::Host);
        let want = naive_logits(&host, &tokens, &Rounding::default());
        let scale = want.iter().flatten().fold(0.0f64, |m, v| m.max(v.abs()));
        let err =
            got.iter().flatten().zip(want.iter().flatten()).fold(0.0f64, |m, (&g, &w)| m.max((f64::from(g) - w).abs()));
        println!("{name} at test size: max |Δlogit| {err:.2e} of a scale {scale:.2e}");
        assert!(err <= 1e-5 * scale.max(1.0), "{name}: logits differ from the f64 pass by {err:e}");
    }
}
