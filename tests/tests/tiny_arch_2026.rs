//! SmolLM3 and Llama 4 (`../shared/models/tiny-arch/{smollm3,llama4}/`, see its README) against
//! `transformers`' float64 goldens, read by a small test-only reader.
//!
//! **To be folded into `tiny_arch.rs`** once `qdrift-load` reads these families (its Hugging Face
//! reader is being rewritten): this file reads `config.json` and `model.safetensors` itself,
//! bf16 → f32, mapping the tensor names to `qdrift_weights`' layout as `crates/load/src/hf/read.rs`
//! does for Llama (q/k rows from the rotate-half to the interleaved RoPE layout with
//! `rotate_half_row_order`; Llama 4's RoPE is interleaved already, `apply_rotary_emb` rotating
//! adjacent pairs, so its rows stay).
//!
//! For each architecture, one test checks that
//! - the independent f64 forward pass (`qdrift_tests::reference64`), teacher-forced on
//!   `golden_logits.safetensors`' `tokens`, gives its `logits` within [`REFERENCE_TOLERANCE`];
//! - the Burn model in f32 on the CPU backend and on wgpu (lavapipe without a GPU) decodes the 40
//!   greedy tokens of each prompt exactly, the three prompts in one left-padded batch (so the
//!   chunked mask and the temperature see padded rows and the KV cache), and its teacher-forced
//!   logits (the prompt in one pass, then chunks of 7 through the KV cache, so that the chunks
//!   reach across passes) agree with the golden ones within [`MODEL_TOLERANCE`].
//!
//! Every check prints its max |Δlogit|.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::tensor::{DType, Int, Tensor, TensorData};
use qdrift_generate::{BackendChoice, ComputeDevice};
use qdrift_load::{
    BlockSpec, Experts, Ffn, HostModel, HostTensor, LayerWeights, Mlp, ModelArch, MoeSpec, Routing, SharedExpert,
    rotate_half_row_order,
};
use qdrift_model::{Llama, Positions};
use qdrift_tests::reference64::{Rounding, naive_logits};
use qdrift_tests::{device, run_greedy_host, shared_dir};
use qdrift_weights::{AttnTemperature, LayerAttention};
use serde_json::Value;

/// The f64 reference against the f64 goldens rounded to f32 (as `tiny_arch.rs`).
const REFERENCE_TOLERANCE: f64 = 1e-5;

/// The f32 model against the goldens (issue #30).
const MODEL_TOLERANCE: f64 = 1e-4;

/// The new tokens of each golden greedy run.
const NEW_TOKENS: usize = 40;

/// One architecture's goldens.
struct Golden {
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

fn id_lists(v: &Value, what: &str) -> Vec<Vec<u32>> {
    let list = v[what].as_array().unwrap_or_else(|| panic!("golden.json: {what} is a list"));
    list.iter()
        .map(|p| {
            let ids = p.as_array().unwrap_or_else(|| panic!("golden.json: {what} holds lists"));
            ids.iter().map(|t| u32::try_from(t.as_u64().expect("token id")).expect("id fits u32")).collect()
        })
        .collect()
}

/// A safetensors file's tensors by name: dtype, shape and bytes (an 8-byte little-endian header
/// length, a JSON header of `{name: {dtype, shape, data_offsets}}`, the data).
fn safetensors(path: &Path) -> Vec<(String, String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).expect("header is JSON");
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
    let json = read_json(&dir.join("golden.json"));
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
    Golden { prompts: id_lists(&json, "prompts"), greedy: id_lists(&json, "greedy"), tokens, logits }
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The checkpoint's tensors by Hugging Face name, bf16 widened to f32 (exact).
struct Checkpoint {
    tensors: HashMap<String, HostTensor>,
}

impl Checkpoint {
    fn read(dir: &Path) -> Checkpoint {
        let tensors = safetensors(&dir.join("model.safetensors"))
            .into_iter()
            .map(|(name, dtype, shape, bytes)| {
                assert_eq!(dtype, "BF16", "{name}: the tiny checkpoints are bf16");
                let data = bytes
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes(b.try_into().expect("2 bytes")).to_f32())
                    .collect();
                (name, HostTensor::new(shape, data).expect("sizes agree"))
            })
            .collect();
        Checkpoint { tensors }
    }

    /// Tensor `name`, which must have `shape`.
    fn get(&self, name: &str, shape: &[usize]) -> HostTensor {
        let t = self.tensors.get(name).unwrap_or_else(|| panic!("model.safetensors has no {name}"));
        assert_eq!(t.shape, shape, "{name}'s shape");
        t.clone()
    }

    /// A q or k projection of `heads` heads, its rows moved from the rotate-half to the
    /// interleaved RoPE layout when `rotate_half` (row `r` to `order[r]`, as
    /// `crates/load/src/rope_layout.rs` does).
    fn qk(&self, name: &str, heads: usize, head_dim: usize, dim: usize, rotate_half: bool) -> HostTensor {
        let t = self.get(name, &[heads * head_dim, dim]);
        if !rotate_half {
            return t;
        }
        let mut data = vec![0.0; t.data.len()];
        for (r, &o) in rotate_half_row_order(heads, head_dim).iter().enumerate() {
            data[o * dim..(o + 1) * dim].copy_from_slice(&t.data[r * dim..(r + 1) * dim]);
        }
        HostTensor { shape: t.shape, data }
    }

    /// A gated FFN `{prefix}.{gate,up,down}_proj.weight` of width `hidden`.
    fn mlp(&self, prefix: &str, hidden: usize, dim: usize) -> Mlp {
        let w = |s: &str, shape: [usize; 2]| self.get(&format!("{prefix}.{s}_proj.weight"), &shape);
        Mlp::new(w("gate", [hidden, dim]), w("up", [hidden, dim]), w("down", [dim, hidden]))
    }

    /// Layer `i`'s weights with feed-forward layer `ffn`.
    fn layer(&self, arch: &ModelArch, i: usize, ffn: Ffn, rotate_half: bool) -> LayerWeights {
        let (d, hd) = (arch.dim, arch.head_dim);
        let p = |s: &str| format!("model.layers.{i}.{s}");
        LayerWeights {
            attn_norm: self.get(&p("input_layernorm.weight"), &[d]),
            wq: self.qk(&p("self_attn.q_proj.weight"), arch.n_heads, hd, d, rotate_half),
            wk: self.qk(&p("self_attn.k_proj.weight"), arch.n_kv_heads, hd, d, rotate_half),
            wv: self.get(&p("self_attn.v_proj.weight"), &[arch.kv_dim(), d]),
            wo: self.get(&p("self_attn.o_proj.weight"), &[d, arch.q_dim()]),
            bq: None,
            bk: None,
            bv: None,
            bo: None,
            q_norm: None,
            k_norm: None,
            sinks: None,
            post_attn_norm: None,
            ffn_norm: self.get(&p("post_attention_layernorm.weight"), &[d]),
            post_ffn_norm: None,
            ffn,
        }
    }
}

fn int(cfg: &Value, key: &str) -> usize {
    cfg[key].as_u64().unwrap_or_else(|| panic!("config.json: {key} is an integer")) as usize
}

fn float(cfg: &Value, key: &str) -> f32 {
    cfg[key].as_f64().unwrap_or_else(|| panic!("config.json: {key} is a number")) as f32
}

/// The Llama-like part of a `config.json`, with `no_rope_layers` (1: RoPE, 0: NoPE).
fn base_arch(cfg: &Value, hidden_dim: usize) -> ModelArch {
    let (dim, n_heads) = (int(cfg, "hidden_size"), int(cfg, "num_attention_heads"));
    let n_layers = int(cfg, "num_hidden_layers");
    let rope: Vec<bool> =
        cfg["no_rope_layers"].as_array().expect("no_rope_layers").iter().map(|v| v.as_u64() != Some(0)).collect();
    assert_eq!(cfg["rope_parameters"]["rope_type"], "default", "plain RoPE");
    ModelArch {
        architecture: cfg["architectures"][0].as_str().expect("architectures").to_string(),
        dim,
        hidden_dim,
        n_layers,
        n_heads,
        n_kv_heads: int(cfg, "num_key_value_heads"),
        head_dim: cfg["head_dim"].as_u64().map_or(dim / n_heads, |h| h as usize),
        vocab_size: int(cfg, "vocab_size"),
        max_seq_len: int(cfg, "max_position_embeddings"),
        norm_eps: float(cfg, "rms_norm_eps"),
        rope_theta: cfg["rope_parameters"]["rope_theta"].as_f64().expect("rope_theta") as f32,
        tied_embeddings: cfg["tie_word_embeddings"].as_bool().expect("tie_word_embeddings"),
        rope_scaling: None,
        block: BlockSpec::default(),
        windows: Vec::new(),
        local_rope_theta: None,
        embedding_scale: None,
        final_logit_softcap: None,
        moe: None,
        layer_attention: LayerAttention { rope, ..LayerAttention::default() },
    }
}

/// The whole model from the architecture and its layers.
fn host_model(ck: &Checkpoint, arch: ModelArch, layers: Vec<LayerWeights>) -> HostModel {
    let (v, d) = (arch.vocab_size, arch.dim);
    let output = (!arch.tied_embeddings).then(|| ck.get("lm_head.weight", &[v, d]));
    HostModel {
        token_embedding: ck.get("model.embed_tokens.weight", &[v, d]),
        final_norm: ck.get("model.norm.weight", &[d]),
        output,
        layers,
        arch,
    }
}

/// SmolLM3 (`SmolLM3ForCausalLM`): Llama's block with NoPE layers and tied embeddings; its q/k
/// rows are in the rotate-half layout.
fn smollm3() -> HostModel {
    let dir = arch_dir("smollm3");
    let cfg = read_json(&dir.join("config.json"));
    assert_eq!(cfg["use_sliding_window"], false, "no sliding windows");
    let ck = Checkpoint::read(&dir);
    let arch = base_arch(&cfg, int(&cfg, "intermediate_size"));
    arch.validate().expect("a valid architecture");
    let layers = (0..arch.n_layers)
        .map(|i| {
            let mlp = ck.mlp(&format!("model.layers.{i}.mlp"), arch.hidden_dim, arch.dim);
            ck.layer(&arch, i, Ffn::Dense(mlp), true)
        })
        .collect();
    host_model(&ck, arch, layers)
}

/// Llama 4's text model (`Llama4ForCausalLM`): chunked attention on the `chunked_attention`
/// layers, NoPE layers with attention temperature, L2 q/k norm on the RoPE layers, a mixture of
/// experts on `moe_layers` and a dense FFN (`intermediate_size_mlp`) elsewhere; its q/k rows are
/// in the interleaved layout already.
fn llama4() -> HostModel {
    let dir = arch_dir("llama4");
    let cfg = read_json(&dir.join("config.json"));
    let ck = Checkpoint::read(&dir);
    let mut arch = base_arch(&cfg, int(&cfg, "intermediate_size_mlp"));
    let chunk = int(&cfg, "attention_chunk_size");
    let types = cfg["layer_types"].as_array().expect("layer_types");
    arch.layer_attention.chunks = types.iter().map(|t| (t == "chunked_attention").then_some(chunk)).collect();
    if cfg["use_qk_norm"] == true {
        arch.layer_attention.qk_l2_norm = Some(arch.norm_eps);
    }
    if cfg["attn_temperature_tuning"] == true {
        let (floor_scale, attn_scale) = (float(&cfg, "floor_scale"), float(&cfg, "attn_scale"));
        arch.layer_attention.temperature = Some(AttnTemperature { floor_scale, attn_scale });
    }
    let moe_layers: Vec<usize> =
        cfg["moe_layers"].as_array().expect("moe_layers").iter().map(|l| l.as_u64().expect("layer") as usize).collect();
    let expert_hidden = int(&cfg, "intermediate_size");
    arch.moe = Some(MoeSpec {
        n_experts: int(&cfg, "num_local_experts"),
        top_k: int(&cfg, "num_experts_per_tok"),
        expert_hidden,
        routing: Routing::SigmoidInput,
        dense_layers: (0..arch.n_layers).filter(|l| !moe_layers.contains(l)).collect(),
        shared_expert_hidden: Some(expert_hidden),
    });
    arch.validate().expect("a valid architecture");
    let layers = (0..arch.n_layers)
        .map(|i| {
            let p = format!("model.layers.{i}.feed_forward");
            let ffn = if arch.has_experts(i) {
                Ffn::Experts(llama4_experts(&ck, &p, &arch))
            } else {
                Ffn::Dense(ck.mlp(&p, arch.hidden_dim, arch.dim))
            };
            ck.layer(&arch, i, ffn, false)
        })
        .collect();
    host_model(&ck, arch, layers)
}

/// A Llama 4 mixture of experts (`Llama4TextMoe`): the router, the experts stored fused
/// (`experts.gate_up_proj` `[E, dim, 2I]`, gate columns first, then up; `experts.down_proj`
/// `[E, I, dim]`; both `[in, out]`, so transposed here) and the ungated shared expert.
fn llama4_experts(ck: &Checkpoint, p: &str, arch: &ModelArch) -> Experts {
    let moe = arch.moe.as_ref().expect("a mixture of experts");
    let (n, h, d) = (moe.n_experts, moe.expert_hidden, arch.dim);
    let gate_up = ck.get(&format!("{p}.experts.gate_up_proj"), &[n, d, 2 * h]);
    let down = ck.get(&format!("{p}.experts.down_proj"), &[n, h, d]);
    // Columns `from..from + rows` of `[in, out]` matrix `e` of `t` as an `[rows, in]` weight.
    let transposed = |t: &HostTensor, e: usize, [inp, out]: [usize; 2], from: usize, rows: usize| {
        let m = &t.data[e * inp * out..(e + 1) * inp * out];
        let data = (0..rows).flat_map(|r| (0..inp).map(move |i| m[i * out + from + r])).collect();
        HostTensor { shape: vec![rows, inp], data }
    };
    let experts = (0..n)
        .map(|e| {
            Mlp::new(
                transposed(&gate_up, e, [d, 2 * h], 0, h),
                transposed(&gate_up, e, [d, 2 * h], h, h),
                transposed(&down, e, [h, d], 0, d),
            )
        })
        .collect();
    Experts {
        router: ck.get(&format!("{p}.router.weight"), &[n, d]),
        router_bias: None,
        experts,
        shared: Some(SharedExpert {
            mlp: ck.mlp(&format!("{p}.shared_expert"), h, d),
            gate: HostTensor { shape: vec![0, d], data: Vec::new() },
        }),
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

/// The f64 reference's teacher-forced logits against the goldens.
fn check_reference(arch: &str, host: &HostModel, g: &Golden) -> f64 {
    assert_eq!(g.tokens[..g.prompts[0].len()], g.prompts[0], "{arch}: the logits' sequence starts with prompt 0");
    let reference = naive_logits(host, &g.tokens, &Rounding::default());
    let err = max_abs(&reference, &g.logits);
    println!("{arch}: f64 reference: teacher-forced max |Δlogit| {err:.2e}");
    assert!(err <= REFERENCE_TOLERANCE, "{arch}: the f64 reference's logits differ by up to {err:.2e}");
    err
}

/// The Burn model on `choice`: greedy tokens of the three prompts in one left-padded batch, and
/// teacher-forced logits; returns their max |Δlogit| against the goldens.
fn check_model(arch: &str, host: &HostModel, g: &Golden, choice: BackendChoice) -> f64 {
    let dev = device(choice);
    let start = std::time::Instant::now();
    let (tokens, first) = run_greedy_host(host, &dev, DType::F32, &g.prompts, NEW_TOKENS, g.prompts.len());
    let decoding = start.elapsed().as_secs_f64();
    for (i, (got, want)) in tokens.iter().zip(&g.greedy).enumerate() {
        let first_diff = got.iter().zip(want).position(|(a, b)| a != b);
        assert_eq!(first_diff, None, "{arch} on {}: prompt {i}'s greedy tokens diverge at {first_diff:?}", dev.adapter);
        assert_eq!(got.len(), want.len(), "{arch} on {}: prompt {i}'s greedy length", dev.adapter);
    }
    // Prompt 0 is not the longest of the batch: its first step ran left-padded.
    let padded = max_abs(&first[..1], &g.logits[g.prompts[0].len() - 1..][..1]);
    let model = Llama::from_host(host, DType::F32, &dev.device).expect("model builds");
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

fn check(arch: &str, host: &HostModel) {
    let g = golden(arch);
    check_reference(arch, host, &g);
    check_model(arch, host, &g, BackendChoice::Cpu);
    check_model(arch, host, &g, BackendChoice::Wgpu);
}

/// NoPE on every 4th layer (`no_rope_layers` `[1, 1, 1, 0]`), tied embeddings.
#[test]
fn smollm3_matches_its_goldens() {
    let host = smollm3();
    assert_eq!(host.arch.layer_attention.rope, [true, true, true, false]);
    check("smollm3", &host);
    // The NoPE layer matters: rotating it too moves the logits far past the tolerance.
    let mut rotated = host.clone();
    rotated.arch.layer_attention.rope.clear();
    let g = golden("smollm3");
    let err = max_abs(&naive_logits(&rotated, &g.tokens, &Rounding::default()), &g.logits);
    println!("smollm3 with RoPE on every layer: max |Δlogit| {err:.2e}");
    assert!(err > 1e-2, "{err:.2e}");
}

/// A change to a model's description.
type Edit = fn(&mut HostModel);

/// Chunked attention (chunk 16) on layers 0–2, a global NoPE layer 3 with attention temperature,
/// L2 q/k norm, experts (4, top-1 sigmoid, shared expert) on layers 1 and 3.
#[test]
fn llama4_matches_its_goldens() {
    let host = llama4();
    let la = &host.arch.layer_attention;
    assert_eq!(la.chunks, [Some(16), Some(16), Some(16), None]);
    assert_eq!((la.qk_l2_norm, la.rope.as_slice()), (Some(1e-6), &[true, true, true, false][..]));
    assert_eq!(host.arch.moe.as_ref().map(|m| m.dense_layers.clone()), Some(vec![0, 2]));
    check("llama4", &host);
    // Every feature matters: without it the f64 reference moves far past the tolerance.
    let g = golden("llama4");
    let edits: [(&str, Edit); 4] = [
        ("no chunks", |m| m.arch.layer_attention.chunks.clear()),
        ("no L2 norm", |m| m.arch.layer_attention.qk_l2_norm = None),
        ("no temperature", |m| m.arch.layer_attention.temperature = None),
        ("weights on the outputs", |m| {
            m.arch.moe.as_mut().expect("experts").routing = Routing::SoftmaxTopK { renormalize: false };
        }),
    ];
    for (what, edit) in edits {
        let mut changed = host.clone();
        edit(&mut changed);
        let err = max_abs(&naive_logits(&changed, &g.tokens, &Rounding::default()), &g.logits);
        println!("llama4 with {what}: max |Δlogit| {err:.2e}");
        assert!(err > 1e-3, "{what}: {err:.2e}");
    }
}
