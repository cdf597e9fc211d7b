//! Helpers shared by qdrift's end-to-end tests.
//!
//! Module floors, top first: a module imports only modules on floors below its own
//! (`cargo xtask cycles` checks it).
//!
//! | floor |
//! |---|
//! | `fuzz/`, `reference64.rs` |

#![forbid(unsafe_code)]

use std::path::PathBuf;

use burn::tensor::DType;
use qdrift_generate::{BackendChoice, ComputeDevice, GenerationConfig, generate, select_device};
use qdrift_load::LoadedModel;
use qdrift_model::Llama;

/// `../shared` beside the repository (override with `QDRIFT_SHARED`): models and golden outputs
/// from independent implementations, read in place.
pub fn shared_dir() -> PathBuf {
    std::env::var_os("QDRIFT_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared"))
}

/// The stories260K model folder.
pub fn stories_dir() -> PathBuf {
    shared_dir().join("models/stories260K")
}

/// stories260K with its tokenizer.
pub fn load_stories() -> LoadedModel {
    let dir = stories_dir();
    qdrift_load::open_model(&dir.join("stories260K.bin"), Some(&dir.join("tok512.bin")))
        .unwrap_or_else(|e| panic!("stories260K must load from {}: {e}", dir.display()))
}

/// LongRoPE's short factors of [`longrope_phi3`] (6 pairs of 12 rotated dimensions).
pub const LONGROPE_SHORT: [f32; 6] = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5];

/// [`longrope_phi3`]'s original context, past which its requests are refused.
pub const LONGROPE_ORIGINAL: usize = 64;

/// The tiny-arch Phi-3 (`../shared/models/tiny-arch/phi3`, copied into `dir`) made a LongRoPE
/// checkpoint, as Phi-4-mini's `config.json` has it, since no `transformers`-written one exists:
/// `rope_scaling = {type: longrope, short_factor: LONGROPE_SHORT, long_factor}`, the top-level
/// `rope_theta` 1e4 and `partial_rotary_factor` 0.75, `original_max_position_embeddings`
/// [`LONGROPE_ORIGINAL`] and `max_position_embeddings` 512 (so the default attention factor is
/// `√(1 + ln 8 / ln 64)` = √1.5, not 1).
pub fn longrope_phi3(dir: &std::path::Path) {
    let src = shared_dir().join("models/tiny-arch/phi3");
    for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap_or_else(|e| panic!("{}: {e}", src.join(f).display()));
    }
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).expect("config.json reads");
    let mut c: serde_json::Value = serde_json::from_str(&text).expect("config.json is JSON");
    let o = c.as_object_mut().expect("config.json is an object");
    o.remove("rope_parameters");
    o.insert("rope_theta".into(), 10000.0.into());
    o.insert("partial_rotary_factor".into(), 0.75.into());
    o.insert(
        "rope_scaling".into(),
        serde_json::json!({"type": "longrope", "short_factor": LONGROPE_SHORT,
            "long_factor": [2.0, 3.0, 5.0, 8.0, 13.0, 21.0]}),
    );
    o.insert("original_max_position_embeddings".into(), LONGROPE_ORIGINAL.into());
    o.insert("max_position_embeddings".into(), 512.into());
    std::fs::write(&path, serde_json::to_vec_pretty(&c).expect("JSON")).expect("config.json writes");
}

/// Width of [`qwen2_moe`]'s shared expert (a multiple of 32, so that every GGUF block format
/// holds its down projection's rows).
pub const QWEN2_MOE_SHARED: usize = 96;

/// A tiny random `Qwen2MoeForCausalLM` checkpoint written into `dir`, since `../shared/` holds no
/// `transformers`-written one: `config.json` as `Qwen2MoeConfig` saves it (hidden 64, 4 heads of
/// 16, 2 KV heads, 3 layers, 8 experts of width 32, top-2 without `norm_topk_prob`, a shared
/// expert of width [`QWEN2_MOE_SHARED`], q/k/v biases, RoPE θ 1e6, untied head), the layers in
/// `mlp_only_layers` dense (width 128); `model.safetensors` in bf16 with the names
/// `Qwen2MoeForCausalLM` loads (`mlp.gate`, `mlp.experts.{e}.{gate,up,down}_proj`,
/// `mlp.shared_expert.{gate,up,down}_proj`, `mlp.shared_expert_gate`); the tokenizer of the
/// tiny-arch Qwen3-MoE (same 512-token vocabulary, so its golden prompts' ids). Weights are
/// seeded [`uniform`] values: ±0.26 (the tiny-arch checkpoints' std 0.15) for matrices and the
/// embedding, 1 ± 0.1 for norms, ±0.05 for biases; the routers ±0.5, so that routing decides.
pub fn qwen2_moe(dir: &std::path::Path, mlp_only_layers: &[usize]) {
    let src = shared_dir().join("models/tiny-arch/qwen3_moe");
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap_or_else(|e| panic!("{}: {e}", src.join(f).display()));
    }
    let (dim, heads, kv, hd, layers, vocab, dense, width, experts) = (64, 4, 2, 16, 3, 512, 128, 32, 8);
    let config = serde_json::json!({
        "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "dtype": "bfloat16",
        "hidden_size": dim, "num_attention_heads": heads, "num_key_value_heads": kv,
        "num_hidden_layers": layers, "vocab_size": vocab, "intermediate_size": dense,
        "moe_intermediate_size": width, "shared_expert_intermediate_size": QWEN2_MOE_SHARED,
        "num_experts": experts, "num_experts_per_tok": 2, "norm_topk_prob": false,
        "decoder_sparse_step": 1, "mlp_only_layers": mlp_only_layers, "qkv_bias": true,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "use_sliding_window": false, "sliding_window": null, "max_window_layers": 28,
        "layer_types": vec!["full_attention"; layers], "tie_word_embeddings": false,
        "eos_token_id": 0, "bos_token_id": null, "pad_token_id": null, "transformers_version": "5.25.0"
    });
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config).expect("JSON")).expect("writes");
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut seed = 0u64;
    let mut add = |name: String, shape: &[usize], offset: f32, scale: f32| {
        seed += 1;
        let n = shape.iter().product();
        let data = uniform(0x0051_3E00 + seed, n).into_iter().map(|v| offset + 2.0 * scale * v).collect();
        tensors.push((name, shape.to_vec(), data));
    };
    add("model.embed_tokens.weight".into(), &[vocab, dim], 0.0, 0.26);
    for i in 0..layers {
        let p = |s: &str| format!("model.layers.{i}.{s}");
        add(p("input_layernorm.weight"), &[dim], 1.0, 0.1);
        add(p("post_attention_layernorm.weight"), &[dim], 1.0, 0.1);
        for (name, out) in [("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)] {
            add(p(&format!("self_attn.{name}.weight")), &[out, dim], 0.0, 0.26);
            add(p(&format!("self_attn.{name}.bias")), &[out], 0.0, 0.05);
        }
        add(p("self_attn.o_proj.weight"), &[dim, heads * hd], 0.0, 0.26);
        let mut mlp = |prefix: String, w: usize| {
            add(format!("{prefix}.gate_proj.weight"), &[w, dim], 0.0, 0.26);
            add(format!("{prefix}.up_proj.weight"), &[w, dim], 0.0, 0.26);
            add(format!("{prefix}.down_proj.weight"), &[dim, w], 0.0, 0.26);
        };
        if mlp_only_layers.contains(&i) {
            mlp(p("mlp"), dense);
            continue;
        }
        for e in 0..experts {
            mlp(p(&format!("mlp.experts.{e}")), width);
        }
        mlp(p("mlp.shared_expert"), QWEN2_MOE_SHARED);
        add(p("mlp.gate.weight"), &[experts, dim], 0.0, 0.5);
        add(p("mlp.shared_expert_gate.weight"), &[1, dim], 0.0, 0.5);
    }
    add("model.norm.weight".into(), &[dim], 1.0, 0.1);
    add("lm_head.weight".into(), &[vocab, dim], 0.0, 0.26);
    write_bf16_safetensors(&dir.join("model.safetensors"), &tensors);
}

/// A safetensors file (8-byte little-endian header length, JSON header, data) of bf16 tensors,
/// each value rounded to nearest even; names sorted, as `safetensors` writes them.
fn write_bf16_safetensors(path: &std::path::Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
    let mut sorted: Vec<&(String, Vec<usize>, Vec<f32>)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut data = Vec::new();
    for (name, shape, values) in sorted {
        let start = data.len();
        data.extend(values.iter().flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes()));
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut head = serde_json::to_vec(&serde_json::Value::Object(header)).expect("JSON");
    while !head.len().is_multiple_of(8) {
        head.push(b' ');
    }
    let mut file = (head.len() as u64).to_le_bytes().to_vec();
    file.extend(head);
    file.extend(data);
    std::fs::write(path, file).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// A small `qdrift eval` of stories260K on the CPU for whole-evaluation identity tests: the first
/// `prompts` prompts in batches of `batch_size` (a short last batch when they do not divide),
/// horizons 5 and 30, teacher forcing in chunks of 8, 200 bootstrap resamples, and the schemes
/// `schemes` after the noise floor.
pub fn stories_eval(prompts: usize, batch_size: usize, schemes: &[&str]) -> qdrift_eval::EvalConfig {
    let dir = stories_dir();
    let mut cfg = qdrift_eval::EvalConfig::new(dir.join("stories260K.bin"));
    cfg.tokenizer = Some(dir.join("tok512.bin"));
    cfg.prompts = Some(prompts);
    cfg.horizons = vec![5, 30];
    cfg.batch_size = Some(batch_size);
    cfg.chunk = 8;
    cfg.resamples = 200;
    cfg.backend = BackendChoice::Cpu;
    cfg.variants = schemes
        .iter()
        .map(|s| qdrift_eval::VariantSpec::Scheme(s.parse().unwrap_or_else(|e| panic!("scheme {s}: {e}"))))
        .collect();
    cfg
}

/// One case of `golden_greedy_fp32.json`.
pub struct GoldenCase {
    /// Prompt text.
    pub prompt: String,
    /// Tokens llama2.c fed the model (BOS first).
    pub prompt_tokens: Vec<u32>,
    /// llama2.c's greedy continuation.
    pub greedy_tokens: Vec<u32>,
    /// Logits at the last prompt position.
    pub next_token_logits: Vec<f32>,
    /// What llama2.c printed.
    pub text: String,
}

/// The golden cases for stories260K, produced by llama2.c's `run.c` in f32.
pub fn golden_cases() -> Vec<GoldenCase> {
    let path = stories_dir().join("golden_greedy_fp32.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let json: serde_json::Value = serde_json::from_str(&text).expect("golden file is JSON");
    let u32s = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().expect("array").iter().map(|x| x.as_u64().expect("token id") as u32).collect()
    };
    json["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| GoldenCase {
            prompt: c["prompt"].as_str().expect("prompt").to_string(),
            prompt_tokens: u32s(&c["prompt_tokens"]),
            greedy_tokens: u32s(&c["greedy_tokens"]),
            next_token_logits: c["next_token_logits"]
                .as_array()
                .expect("logits")
                .iter()
                .map(|x| x.as_f64().expect("logit") as f32)
                .collect(),
            text: c["text"].as_str().expect("text").to_string(),
        })
        .collect()
}

/// The device for a backend; wgpu must be there (CI installs Mesa's lavapipe).
pub fn device(choice: BackendChoice) -> ComputeDevice {
    select_device(choice).unwrap_or_else(|e| panic!("{choice:?} device: {e}"))
}

/// Greedy tokens for `prompts` in batches of `batch_size`, and the first step's logits per prompt.
pub fn run_greedy(
    loaded: &LoadedModel,
    device: &ComputeDevice,
    dtype: DType,
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    batch_size: usize,
) -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
    run_greedy_host(&loaded.model, device, dtype, prompts, max_new_tokens, batch_size)
}

/// [`run_greedy`] of a host model (no tokenizer or file format needed).
pub fn run_greedy_host(
    host: &qdrift_load::HostModel,
    device: &ComputeDevice,
    dtype: DType,
    prompts: &[Vec<u32>],
    max_new_tokens: usize,
    batch_size: usize,
) -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
    let model = Llama::from_host(host, dtype, &device.device).expect("model builds");
    let mut first_logits = vec![Vec::new(); prompts.len()];
    let config = GenerationConfig { max_new_tokens, batch_size, stop_at_eos: None };
    let tokens = generate(&model, device, prompts, &config, |s| {
        if s.step == 0 {
            let [b, v] = s.logits.dims();
            let data = s.logits.to_data().try_into_vec::<f32>().expect("f32 logits");
            for i in 0..b {
                first_logits[s.first_prompt + i] = data[i * v..(i + 1) * v].to_vec();
            }
        }
    })
    .expect("generation runs");
    (tokens, first_logits)
}

/// The golden prompts (token ids) of a tiny-arch checkpoint (`../shared/models/tiny-arch/ARCH`'s
/// `golden.json`).
pub fn tiny_arch_prompts(arch: &str) -> Vec<Vec<u32>> {
    let path = shared_dir().join("models/tiny-arch").join(arch).join("golden.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let json: serde_json::Value = serde_json::from_str(&text).expect("golden.json is JSON");
    let ids =
        |p: &serde_json::Value| p.as_array().expect("ids").iter().map(|t| t.as_u64().expect("id") as u32).collect();
    json["prompts"].as_array().expect("prompts").iter().map(ids).collect()
}

/// Logits `[position][vocab]` of every position of `tokens` (one sequence, no padding):
/// `split` tokens in one pass, then chunks of `step` through the cache, with `kernel`'s caches.
pub fn cached_logits(
    model: &Llama,
    device: &burn::tensor::Device,
    tokens: &[u32],
    (split, step): (usize, usize),
    kernel: qdrift_model::AttentionKernel,
) -> Vec<Vec<f32>> {
    let ids = |t: &[u32]| -> burn::tensor::Tensor<2, burn::tensor::Int> {
        let data: Vec<i32> = t.iter().map(|&x| x as i32).collect();
        burn::tensor::Tensor::from_data(burn::tensor::TensorData::new(data, [1, t.len()]), device)
    };
    let positions = qdrift_model::Positions::left_padded(&[tokens.len()]);
    let mut caches = model.new_caches_for(1, tokens.len(), kernel);
    let mut out = Vec::new();
    for chunk in std::iter::once(&tokens[..split]).chain(tokens[split..].chunks(step)) {
        let logits = model.forward(ids(chunk), &positions, &mut caches, true);
        let [_, t, v] = logits.dims();
        let data = logits.into_data().try_into_vec::<f32>().expect("f32 logits");
        out.extend((0..t).map(|i| data[i * v..(i + 1) * v].to_vec()));
    }
    out
}

/// Per sequence, per mixture-of-experts layer, per continuation position `< n`: the experts
/// `model` routes to in the evaluation's routing pass (`teacher_forced_routes`, on the CPU, two
/// sequences a batch, `chunk` positions a pass).
pub fn recorded_routes(
    model: &Llama,
    sequences: &[(Vec<u32>, Vec<u32>)],
    n: usize,
    chunk: usize,
) -> Vec<Vec<Vec<Vec<u32>>>> {
    let dev = device(BackendChoice::Cpu);
    let layers = (0..model.arch.n_layers).filter(|&l| model.arch.has_experts(l)).count();
    let mut out = vec![vec![vec![Vec::new(); n]; layers]; sequences.len()];
    let forcing = qdrift_generate::Forcing { device: &dev, sequences, batch_size: 2, chunk };
    qdrift_generate::teacher_forced_routes(model, forcing, |c| {
        assert_eq!(c.routes.layers.len(), layers, "one entry per MoE layer");
        for (l, entry) in c.routes.layers.iter().enumerate() {
            let [rows, len, k] = entry.shape;
            for i in 0..rows {
                for j in 0..len {
                    let at = (i * len + j) * k;
                    out[c.first_prompt + i][l][c.start + j] = entry.experts[at..at + k].to_vec();
                }
            }
        }
    })
    .expect("routing pass");
    out
}

/// Uniform values in `[-0.5, 0.5)` from a 64-bit LCG (Knuth's MMIX constants), top 24 bits:
/// deterministic weights and activations for tests.
pub fn uniform(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

pub mod fuzz;
pub mod reference64;
