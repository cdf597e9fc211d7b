//! `qdrift_load::inspect` against hand computations for the stories260K and SmolLM2-135M shapes.
//! Weight memory under the quantization schemes is checked in `qdrift-quantize`'s
//! `tests/footprint.rs` (the schemes' storage accounting lives there).

use std::path::{Path, PathBuf};

use qdrift_load::inspect::{Fp32, inspect, inspect_loaded, inspect_path};
use qdrift_load::{ArchShape, ModelArch, ModelFormat, open_model, synthetic_arch};

/// stories260K (README of shared/models/stories260K).
fn stories_arch() -> ModelArch {
    let shape = ArchShape {
        dim: 64,
        hidden_dim: 172,
        n_layers: 5,
        n_heads: 8,
        n_kv_heads: 4,
        head_dim: 8,
        vocab_size: 512,
        max_seq_len: 512,
    };
    ModelArch { tied_embeddings: true, ..ModelArch::new("llama", shape) }
}

fn bytes_of(i: &qdrift_load::inspect::Inspection, scheme: &str) -> u64 {
    i.weight_bytes.iter().find(|s| s.scheme == scheme).expect("scheme").bytes
}

#[test]
fn stories260k_by_hand() {
    let i = inspect(&stories_arch(), &[], false, 256, 1, &[&Fp32]).expect("fits");
    // head_dim = 64/8 = 8; q = 8·8 = 64; kv = 4·8 = 32.
    // Linears per layer: wq 64·64 + wk 32·64 + wv 32·64 + wo 64·64 + 3 · 172·64
    let linears = 4096 + 2048 + 2048 + 4096 + 3 * 11008; // = 45,312
    let per_layer = linears + 2 * 64; // + two RMSNorms = 45,440
    assert_eq!(i.params.embedding, 512 * 64);
    assert_eq!(i.params.per_layer, per_layer);
    assert_eq!(i.params.layers, 5 * per_layer);
    assert_eq!(i.params.head, 0); // tied
    // 32,768 + 227,200 + 64 = 260,032: the README's count.
    assert_eq!(i.params.total, 260_032);
    assert_eq!(i.params.total, stories_arch().parameter_count() as u64);

    assert_eq!(bytes_of(&i, "fp32"), 4 * 260_032);

    // KV: 2 · 5 layers · 4 kv heads · 8 · 256 positions · 1 sequence = 81,920 entries.
    assert_eq!(i.kv_cache.f16_bytes, 2 * 81_920);
    assert_eq!(i.kv_cache.f32_bytes, 4 * 81_920);
    // FLOPs: 2 · (5 · 45,312 + head 512·64) = 518,656; attention 2·2·5·8·8·256 = 327,680.
    assert_eq!(i.flops_per_token.matmul, 518_656);
    assert_eq!(i.flops_per_token.attention, 327_680);
    assert_eq!(i.flops_per_token.total, 846_336);
    let text = i.to_string();
    assert!(text.contains("parameters 260,032 = embedding 32,768 + 5 × layer 45,440"), "{text}");
}

#[test]
fn smollm2_135m_by_hand() {
    let arch = synthetic_arch("smollm2-135m").expect("preset");
    let i = inspect(&arch, &[], false, 2048, 4, &[&Fp32]).expect("fits");
    // d 576, h 1536, 9 heads of 64, 3 kv heads: q = 576, kv = 192.
    let linears = 576 * 576 * 2 + 192 * 576 * 2 + 3 * 1536 * 576; // 3,538,944
    assert_eq!(i.params.per_layer, linears + 2 * 576);
    // 49,152·576 + 30 · 3,540,096 + 576 = 134,515,008 (tied).
    assert_eq!(i.params.total, 28_311_552 + 30 * 3_540_096 + 576);
    assert_eq!(i.params.total, 134_515_008);
    assert_eq!(bytes_of(&i, "fp32"), 4 * 134_515_008);
    // KV: 2 · 30 · 3 · 64 · 2 bytes · 2048 · 4 = 188,743,680 (180 MiB) at f16.
    assert_eq!(i.kv_cache.f16_bytes, 188_743_680);
    // FLOPs: 2 · (30 · 3,538,944 + 49,152·576) = 268,959,744; attention 2·2·30·9·64·2048.
    assert_eq!(i.flops_per_token.matmul, 268_959_744);
    assert_eq!(i.flops_per_token.attention, 141_557_760);
}

#[test]
fn llama_8b_counts_an_untied_head_and_needs_no_weights() {
    let i = inspect(&synthetic_arch("llama-8b").expect("preset"), &[], false, 8192, 1, &[]).expect("fits");
    assert_eq!(i.params.head, 128_256 * 4096);
    assert_eq!(i.params.total, 8_030_261_248);
    // 2 · 32 · 8 · 128 · 8192 · 2 bytes = 1 GiB of f16 KV cache at 8k context.
    assert_eq!(i.kv_cache.f16_bytes, 1 << 30);
    // `qdrift inspect`'s path: the preset's shape, marked synthetic, seed ignored.
    let by_path = inspect_path(Path::new("synthetic:llama-8b:3"), None, Some(8192), 1, &[]).expect("shape only");
    assert_eq!(by_path, i.with_format(ModelFormat::Synthetic));
    assert!(by_path.synthetic);
    let e = inspect_path(Path::new("synthetic:gpt-5"), None, None, 1, &[]).expect_err("unknown").to_string();
    assert!(e.contains("unknown synthetic model gpt-5; presets: tiny,"), "{e}");
}

#[test]
fn smollm2_gguf_source_dtypes_and_flags() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !p.is_file() {
        println!("skipped: {} is absent", p.display());
        return;
    }
    let m = open_model(&p, None).expect("opens");
    let i = inspect_loaded(&m, 512, 1, &[&Fp32]).expect("fits");
    assert_eq!(i.format, Some(ModelFormat::Gguf));
    assert!(!i.synthetic);
    assert_eq!(i.params.total, 134_515_008);
    let tensors: usize = i.source_dtypes.iter().map(|c| c.tensors).sum();
    assert_eq!(tensors, 30 * 9 + 2); // 9 per layer, embedding, final norm (tied)
    println!("{i}");
    println!("{}", serde_json::to_string(&i).expect("json"));
}

#[test]
fn synthetic_runs_are_marked() {
    let m = open_model(&PathBuf::from("synthetic:tiny"), None).expect("tiny");
    let i = inspect_loaded(&m, 16, 2, &[]).expect("fits");
    assert!(i.synthetic);
    assert!(i.to_string().contains("SYNTHETIC"));
    assert_eq!(i.source_dtypes, vec![qdrift_load::inspect::DtypeCount { dtype: "F32".into(), tensors: 2 * 9 + 2 }]);
}
