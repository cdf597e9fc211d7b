//! GGUF for llama.cpp's `qwen3`, `qwen3moe`, `gemma2`, `gemma3`, `phi3`, `gpt-oss` and `llama`
//! with experts: small [`HostModel`]s built by hand (every feature of each architecture)
//! written by `write_gguf_with` and read back by `read_gguf` equal (F32: bit for bit; ggml
//! blocks: each matrix row-wise dequantized); the tensor names and metadata keys llama.cpp's
//! loader asks for; refusals by feature. `gguf_py_reads_every_family` checks the files with
//! gguf-py (`pip install gguf==0.19.0`), skipping with a message when its venv is absent.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use qdrift_ggml::{GgmlType, dequantize_ggml_blocks, quantize_ggml_blocks};
use qdrift_load::write::{GgufMatrix, GgufStored, WriteDtype, write_gguf_with};
use qdrift_load::{
    Activation, ArchShape, Experts, Ffn, GgufModel, GgufValue, HostModel, HostTensor, LayerWeights, Mlp, ModelArch,
    MoeSpec, NormStyle, RopeScaling, Routing, read_gguf, read_gguf_metadata,
};

/// Deterministic values in [-1, 1).
struct Rng(u64);

impl Rng {
    fn tensor(&mut self, shape: &[usize]) -> HostTensor {
        let n = shape.iter().product();
        let data = (0..n)
            .map(|_| {
                self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        HostTensor { shape: shape.to_vec(), data }
    }
}

const FAMILIES: [&str; 7] = ["qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "gpt-oss", "mixtral"];

fn base_arch(name: &str) -> ModelArch {
    let shape = ArchShape {
        dim: 32,
        hidden_dim: 64,
        n_layers: 4,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim: 16,
        vocab_size: 48,
        max_seq_len: 256,
    };
    ModelArch { norm_eps: 1e-6, rope_theta: 1e6, ..ModelArch::new(name, shape) }
}

/// The architecture of each family as a Hugging Face reader describes it (Gemma norms raw).
fn family_arch(family: &str) -> ModelArch {
    let mut a = base_arch(family);
    let moe = |routing| MoeSpec {
        n_experts: 4,
        top_k: 2,
        expert_hidden: 32,
        routing,
        dense_layers: Vec::new(),
        shared_expert_hidden: None,
    };
    match family {
        "qwen3" => {
            a.architecture = "Qwen3ForCausalLM".into();
            a.block.qk_norm = true;
        }
        "qwen3moe" => {
            a.architecture = "Qwen3MoeForCausalLM".into();
            a.block.qk_norm = true;
            a.moe = Some(moe(Routing::SoftmaxTopK { renormalize: true }));
        }
        "gemma2" | "gemma3" => {
            a.block.norm = NormStyle::OnePlusWeight;
            a.block.sandwich_norms = true;
            a.block.activation = Activation::GeluTanh;
            a.embedding_scale = Some((a.dim as f32).sqrt());
            a.block.attn_scale = Some(0.25);
            a.tied_embeddings = true;
            a.final_logit_softcap = Some(4.0);
            if family == "gemma2" {
                a.architecture = "Gemma2ForCausalLM".into();
                a.block.attn_softcap = Some(5.0);
                a.rope_theta = 10000.0;
                a.windows = (0..a.n_layers).map(|i| (i % 2 == 0).then_some(16)).collect();
            } else {
                a.architecture = "Gemma3ForCausalLM".into();
                a.n_layers = 6;
                a.block.qk_norm = true;
                a.windows = (0..a.n_layers).map(|i| (i % 6 < 5).then_some(16)).collect();
                a.local_rope_theta = Some(10000.0);
                a.rope_scaling = Some(RopeScaling::Linear { factor: 8.0 });
            }
        }
        "phi3" => {
            a.architecture = "Phi3ForCausalLM".into();
            a.head_dim = 8;
            a.block.rotary_dim = Some(6);
            a.tied_embeddings = true;
        }
        "gpt-oss" => {
            a.architecture = "GptOssForCausalLM".into();
            a.block.sinks = true;
            a.block.activation = Activation::ClampedSwiGlu { alpha: 1.702, limit: 7.0 };
            a.windows = (0..a.n_layers).map(|i| (i % 2 == 0).then_some(16)).collect();
            a.moe = Some(moe(Routing::TopKSoftmax));
            a.rope_scaling = Some(RopeScaling::Yarn {
                factor: 32.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                original_max_position_embeddings: 64,
                truncate: true,
                attention_factor: 1.0 + 0.1 * 32f32.ln(),
            });
        }
        "mixtral" => {
            a.architecture = "MixtralForCausalLM".into();
            a.head_dim = 8;
            a.hidden_dim = 32;
            a.moe = Some(moe(Routing::SoftmaxTopK { renormalize: true }));
        }
        other => panic!("{other}"),
    }
    a.validate().expect("valid architecture");
    a
}

fn mlp(r: &mut Rng, dim: usize, hidden: usize, biases: bool) -> Mlp {
    let mut m = Mlp::new(r.tensor(&[hidden, dim]), r.tensor(&[hidden, dim]), r.tensor(&[dim, hidden]));
    if biases {
        m.gate_bias = Some(r.tensor(&[hidden]));
        m.up_bias = Some(r.tensor(&[hidden]));
        m.down_bias = Some(r.tensor(&[dim]));
    }
    m
}

/// Random weights for every tensor `arch` implies.
fn model(arch: ModelArch, seed: u64) -> HostModel {
    let mut r = Rng(seed);
    let (d, q, kv, hd) = (arch.dim, arch.q_dim(), arch.kv_dim(), arch.head_dim);
    let gpt_oss = arch.block.sinks;
    let layers = (0..arch.n_layers)
        .map(|i| {
            let ffn = match &arch.moe {
                Some(m) if arch.has_experts(i) => Ffn::Experts(Experts {
                    router: r.tensor(&[m.n_experts, d]),
                    router_bias: gpt_oss.then(|| r.tensor(&[m.n_experts])),
                    experts: (0..m.n_experts).map(|_| mlp(&mut r, d, m.expert_hidden, gpt_oss)).collect(),
                    shared: None,
                }),
                _ => Ffn::Dense(mlp(&mut r, d, arch.hidden_dim, false)),
            };
            let sandwich = arch.block.sandwich_norms;
            LayerWeights {
                attn_norm: r.tensor(&[d]),
                wq: r.tensor(&[q, d]),
                wk: r.tensor(&[kv, d]),
                wv: r.tensor(&[kv, d]),
                wo: r.tensor(&[d, q]),
                bq: gpt_oss.then(|| r.tensor(&[q])),
                bk: gpt_oss.then(|| r.tensor(&[kv])),
                bv: gpt_oss.then(|| r.tensor(&[kv])),
                bo: gpt_oss.then(|| r.tensor(&[d])),
                q_norm: arch.block.qk_norm.then(|| r.tensor(&[hd])),
                k_norm: arch.block.qk_norm.then(|| r.tensor(&[hd])),
                sinks: gpt_oss.then(|| r.tensor(&[arch.n_heads])),
                post_attn_norm: sandwich.then(|| r.tensor(&[d])),
                ffn_norm: r.tensor(&[d]),
                post_ffn_norm: sandwich.then(|| r.tensor(&[d])),
                ffn,
            }
        })
        .collect();
    HostModel {
        token_embedding: r.tensor(&[arch.vocab_size, d]),
        final_norm: r.tensor(&[d]),
        output: (!arch.tied_embeddings).then(|| r.tensor(&[arch.vocab_size, d])),
        layers,
        arch,
    }
}

/// The GGUF architecture name of a test family.
fn gguf_name(family: &str) -> &str {
    if family == "mixtral" { "llama" } else { family }
}

/// What reading the written file must give: llama.cpp's architecture name, Gemma's `1 + w`
/// norms as plain weights.
fn as_read_back(m: &HostModel, family: &str) -> HostModel {
    let mut e = m.clone();
    e.arch.architecture = gguf_name(family).to_string();
    if e.arch.block.norm == NormStyle::OnePlusWeight {
        e.arch.block.norm = NormStyle::Weight;
        let plus = |t: &mut HostTensor| t.data.iter_mut().for_each(|v| *v += 1.0);
        plus(&mut e.final_norm);
        for l in &mut e.layers {
            plus(&mut l.attn_norm);
            plus(&mut l.ffn_norm);
            for t in [&mut l.post_attn_norm, &mut l.post_ffn_norm, &mut l.q_norm, &mut l.k_norm].into_iter().flatten() {
                plus(t);
            }
        }
    }
    e
}

fn write(dir: &Path, family: &str, m: &HostModel, store: &dyn Fn(GgufMatrix) -> Option<GgufStored>) -> PathBuf {
    let path = dir.join(format!("{family}.gguf"));
    write_gguf_with(&path, m, &[], WriteDtype::F32, store).unwrap_or_else(|e| panic!("{family}: {e}"));
    path
}

fn read(path: &Path) -> GgufModel {
    read_gguf(path).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_family_round_trips_bit_exact_in_f32() {
    let dir = tempfile::tempdir().expect("tempdir");
    for family in FAMILIES {
        let m = model(family_arch(family), 7);
        let g = read(&write(dir.path(), family, &m, &|_| None));
        assert_eq!(g.model, as_read_back(&m, family), "{family}");
        assert!(g.tensor_types.iter().all(|(_, t)| *t == "F32"), "{family}");
    }
}

/// The tensors of block 0 and the global ones each architecture's llama.cpp loader asks for.
fn expected_tensors(family: &str) -> (Vec<&'static str>, Vec<&'static str>) {
    match family {
        "qwen3" => (
            vec!["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm", "ffn_norm"]
                .into_iter()
                .chain(["ffn_gate", "ffn_up", "ffn_down"])
                .collect(),
            vec!["token_embd", "output_norm", "output"],
        ),
        "qwen3moe" | "mixtral" => {
            let mut t = vec!["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate_inp"];
            t.extend(["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]);
            if family == "qwen3moe" {
                t.extend(["attn_q_norm", "attn_k_norm"]);
            }
            (t, vec!["token_embd", "output_norm", "output"])
        }
        "gemma2" | "gemma3" => {
            let mut t = vec!["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "post_attention_norm"];
            t.extend(["ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm"]);
            if family == "gemma3" {
                t.extend(["attn_q_norm", "attn_k_norm"]);
            }
            (t, vec!["token_embd", "output_norm"])
        }
        "phi3" => (
            vec!["attn_norm", "attn_qkv", "attn_output", "ffn_norm", "ffn_up", "ffn_down"],
            vec!["token_embd", "output_norm"],
        ),
        "gpt-oss" => {
            let mut t = vec!["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_sinks"];
            t.extend(["post_attention_norm", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]);
            (t, vec!["token_embd", "output_norm", "output"])
        }
        other => panic!("{other}"),
    }
}

/// The keys beyond the common ones each architecture has.
fn expected_keys(family: &str) -> &'static [&'static str] {
    match family {
        "qwen3" | "phi3" => &["attention.key_length", "attention.value_length"],
        "qwen3moe" => &[
            "attention.key_length",
            "attention.value_length",
            "expert_count",
            "expert_used_count",
            "expert_feed_forward_length",
        ],
        // head_dim = dim / n_heads: no key_length, as the dense `llama` writer.
        "mixtral" => &["expert_count", "expert_used_count"],
        "gemma2" => &[
            "attention.key_length",
            "attention.value_length",
            "attn_logit_softcapping",
            "final_logit_softcapping",
            "attention.sliding_window",
        ],
        "gemma3" => &[
            "attention.key_length",
            "attention.value_length",
            "final_logit_softcapping",
            "attention.sliding_window",
            "rope.freq_base_swa",
            "rope.scaling.type",
            "rope.scaling.factor",
        ],
        "gpt-oss" => &[
            "attention.key_length",
            "attention.value_length",
            "expert_count",
            "expert_used_count",
            "expert_feed_forward_length",
            "attention.sliding_window",
            "rope.scaling.type",
            "rope.scaling.factor",
            "rope.scaling.original_context_length",
            "rope.scaling.yarn_beta_fast",
            "rope.scaling.yarn_beta_slow",
        ],
        other => panic!("{other}"),
    }
}

/// The tensors of block 0 and the keys, as llama.cpp's `load_arch_tensors`/`load_arch_hparams`
/// of each architecture ask for them.
#[test]
fn every_family_has_llama_cpp_names_and_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let common_keys = [
        "general.architecture",
        "general.name",
        "general.alignment",
        "A.context_length",
        "A.embedding_length",
        "A.block_count",
        "A.feed_forward_length",
        "A.attention.head_count",
        "A.attention.head_count_kv",
        "A.attention.layer_norm_rms_epsilon",
        "A.rope.freq_base",
        "A.rope.dimension_count",
        "A.vocab_size",
    ];
    for family in FAMILIES {
        let arch = gguf_name(family);
        let m = model(family_arch(family), 3);
        let g = read(&write(dir.path(), family, &m, &|_| None));
        let (block0, global) = expected_tensors(family);
        let mut want: BTreeSet<String> = block0.iter().map(|t| format!("blk.0.{t}.weight")).collect();
        want.extend(global.iter().map(|t| format!("{t}.weight")));
        if family == "gpt-oss" {
            for t in ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps"] {
                want.insert(format!("blk.0.{t}.bias"));
            }
            want.insert("blk.0.ffn_down_exps.bias".into());
        }
        let got: BTreeSet<String> = g
            .tensor_types
            .iter()
            .map(|(n, _)| n.clone())
            .filter(|n| !n.starts_with("blk.") || n.starts_with("blk.0."))
            .collect();
        assert_eq!(got, want, "{family}");

        let mut keys: BTreeSet<String> = common_keys.iter().map(|k| k.replace("A.", &format!("{arch}."))).collect();
        let extra = expected_keys(family);
        keys.extend(extra.iter().map(|k| format!("{arch}.{k}")));
        let got_keys: BTreeSet<String> = g.metadata.keys().cloned().collect();
        assert_eq!(got_keys, keys, "{family}");
        let meta = |k: &str| g.metadata.get(&format!("{arch}.{k}")).cloned();
        let key_length = meta("attention.key_length").and_then(|v| v.as_u64());
        assert_eq!(key_length.unwrap_or(8), m.arch.head_dim as u64, "{family}");
        assert_eq!(meta("rope.dimension_count").and_then(|v| v.as_u64()), Some(m.arch.rotary_dim() as u64));
        let value = |name: &str| g.tensors.iter().find(|t| t.name == name).map(|t| t.dims.clone());
        match family {
            "phi3" => {
                // q‖k‖v rows and gate‖up rows fused, ggml dims innermost first.
                assert_eq!(value("blk.0.attn_qkv.weight"), Some(vec![32, 32 + 2 * 16]));
                assert_eq!(value("blk.0.ffn_up.weight"), Some(vec![32, 2 * 64]));
            }
            "qwen3moe" | "gpt-oss" | "mixtral" => {
                assert_eq!(value("blk.0.ffn_gate_exps.weight"), Some(vec![32, 32, 4]));
                assert_eq!(value("blk.0.ffn_down_exps.weight"), Some(vec![32, 32, 4]));
                assert_eq!(value("blk.0.ffn_gate_inp.weight"), Some(vec![32, 4]));
            }
            _ => {}
        }
    }
}

/// The stored values of the fixed-layout tensors: Gemma's norms hold `1 + w`; NEOX q rows are
/// rotate-half over the rotated dims (phi3: 6 of 8), `llama` (Mixtral) keeps them interleaved.
#[test]
fn stored_layouts_are_llama_cpps() {
    let dir = tempfile::tempdir().expect("tempdir");
    for family in ["gemma3", "phi3", "mixtral"] {
        let m = model(family_arch(family), 11);
        let path = write(dir.path(), family, &m, &|_| None);
        let bytes = std::fs::read(&path).expect("read");
        let g = read(&path);
        let l = &m.layers[0];
        // The file's copy of a tensor: the F32 data section is the last bytes before the next.
        let find = |values: &[f32]| {
            let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            bytes.windows(raw.len()).any(|w| w == raw.as_slice())
        };
        match family {
            "gemma3" => {
                let plus: Vec<f32> = l.attn_norm.data.iter().map(|w| w + 1.0).collect();
                assert!(find(&plus), "gemma3 attn_norm holds 1 + w");
            }
            "phi3" => {
                // Head 0 of wq: rotate-half rows (0, 2, 4, 1, 3, 5) then 6, 7 unchanged.
                let row = |r: usize| &l.wq.data[r * 32..(r + 1) * 32];
                let head0: Vec<f32> = [0, 2, 4, 1, 3, 5, 6, 7].iter().flat_map(|&r| row(r).to_vec()).collect();
                assert!(find(&head0), "phi3 q rows rotate-half over the 6 rotated dims");
            }
            _ => assert!(find(&l.wq.data), "llama q rows interleaved"),
        }
        assert_eq!(g.model, as_read_back(&m, family));
    }
}

/// Every matrix stored in ggml blocks (Q8_0; MXFP4 for the experts, as real gpt-oss files ship
/// them): the read-back is each matrix dequantized row by row, experts included.
#[test]
fn quantized_matrices_and_experts_read_back_row_by_row() {
    let dir = tempfile::tempdir().expect("tempdir");
    for family in FAMILIES {
        let m = model(family_arch(family), 5);
        let ty = |g: GgufMatrix| match g {
            GgufMatrix::Linear { short_name, .. } if short_name.expert.is_some() => GgmlType::Mxfp4,
            _ => GgmlType::Q8_0,
        };
        let matrix = |g: GgufMatrix| -> &HostTensor {
            match g {
                GgufMatrix::TokenEmbedding => &m.token_embedding,
                GgufMatrix::Output => m.output_weight(),
                GgufMatrix::Linear { layer, short_name } => {
                    m.layers[layer].linears().into_iter().find(|(n, _)| *n == short_name).expect("linear").1
                }
            }
        };
        let store = |g: GgufMatrix| {
            let bytes = quantize_ggml_blocks(ty(g), &matrix(g).data).expect("quantize");
            Some(GgufStored { ggml_type: ty(g).gguf_id(), bytes })
        };
        let g = read(&write(dir.path(), family, &m, &store));
        let mut want = m.clone();
        let round = |t: &mut HostTensor, k: GgmlType| {
            let q = quantize_ggml_blocks(k, &t.data).expect("quantize");
            t.data = dequantize_ggml_blocks(k, &q, t.data.len()).expect("dequantize");
        };
        round(&mut want.token_embedding, GgmlType::Q8_0);
        if let Some(o) = &mut want.output {
            round(o, GgmlType::Q8_0);
        }
        for l in &mut want.layers {
            for (n, t) in l.linears_mut() {
                round(t, if n.expert.is_some() { GgmlType::Mxfp4 } else { GgmlType::Q8_0 });
            }
        }
        assert_eq!(g.model, as_read_back(&want, family), "{family}");
        let types: BTreeSet<&str> = g.tensor_types.iter().map(|(_, t)| *t).collect();
        let expected: BTreeSet<&str> =
            if m.arch.moe.is_some() { ["F32", "Q8_0", "MXFP4"].into() } else { ["F32", "Q8_0"].into() };
        assert_eq!(types, expected, "{family}");
    }
}

fn refusal(m: &HostModel) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = write_gguf_with(&dir.path().join("x.gguf"), m, &[], WriteDtype::F32, &|_| None).expect_err("refused");
    e.to_string()
}

#[test]
fn writer_refuses_what_llama_cpp_does_not_compute_by_feature() {
    let mut m = model(family_arch("qwen3"), 1);
    m.arch.windows = vec![Some(8); m.arch.n_layers];
    assert!(
        refusal(&m)
            .ends_with("cannot be written as GGUF qwen3: sliding-window layers (llama.cpp's qwen3 attends fully)"),
        "{}",
        refusal(&m)
    );

    let mut m = model(family_arch("qwen3moe"), 1);
    m.arch.moe.as_mut().expect("moe").routing = Routing::SoftmaxTopK { renormalize: false };
    assert!(refusal(&m).contains("routing SoftmaxTopK { renormalize: false }"), "{}", refusal(&m));
    m.arch.moe.as_mut().expect("moe").dense_layers = vec![1];
    assert!(refusal(&m).contains("dense FFN layers [1] among the expert layers"), "{}", refusal(&m));

    let mut m = model(family_arch("gemma2"), 1);
    m.arch.block.attn_scale = Some(0.1);
    assert!(refusal(&m).contains("the attention scale 0.1 (query_pre_attn_scalar^-½) differs"), "{}", refusal(&m));
    m.arch.block.attn_scale = Some(0.25);
    m.arch.block.attn_softcap = None;
    assert!(refusal(&m).contains("no attention-logit soft cap"), "{}", refusal(&m));

    let mut m = model(family_arch("gpt-oss"), 1);
    if let Some(RopeScaling::Yarn { beta_fast, .. }) = &mut m.arch.rope_scaling {
        *beta_fast = 16.0;
    }
    assert!(refusal(&m).contains("YaRN beta_fast 16 / beta_slow 1 (llama.cpp uses 32 / 1)"), "{}", refusal(&m));

    let mut m = model(family_arch("qwen3"), 1);
    m.arch.block.rotary_dim = Some(8);
    assert!(
        refusal(&m).contains("partial rotary embeddings (8 of 16 dims; only phi3 and glm4moe have them)"),
        "{}",
        refusal(&m)
    );
}

/// `family`'s file with `edit` applied to its bytes, read again: the error.
fn edited(family: &str, edit: impl FnOnce(&mut Vec<u8>)) -> String {
    let m = model(family_arch(family), 2);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(dir.path(), family, &m, &|_| None);
    let mut bytes = std::fs::read(&path).expect("read");
    edit(&mut bytes);
    std::fs::write(&path, &bytes).expect("write");
    match read_gguf(&path) {
        Ok(_) => "read".to_string(),
        Err(e) => e.to_string(),
    }
}

/// Sets the `u32` value of metadata key `key` (key string, then type 4, then the value).
fn patch_u32(bytes: &mut [u8], key: &str, value: u32) {
    let mut needle = (key.len() as u64).to_le_bytes().to_vec();
    needle.extend(key.as_bytes());
    needle.extend(4u32.to_le_bytes());
    let at = bytes.windows(needle.len()).position(|w| w == needle.as_slice()).expect("key") + needle.len();
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

/// Renames a tensor (same length).
fn rename(bytes: &mut [u8], from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let at = bytes.windows(from.len()).position(|w| w == from.as_bytes()).expect("name");
    bytes[at..at + to.len()].copy_from_slice(to.as_bytes());
}

#[test]
fn reader_refuses_by_feature() {
    assert_eq!(edited("gpt-oss", |_| {}), "read");
    let e = edited("qwen3", |b| patch_u32(b, "qwen3.rope.dimension_count", 8));
    assert!(
        e.ends_with(
            "qwen3.rope.dimension_count is 8 but the head dimension is 16: partial rotary embeddings are not \
             supported for qwen3"
        ),
        "{e}"
    );
    let e = edited("qwen3", |b| patch_u32(b, "qwen3.attention.value_length", 8));
    assert!(e.contains("different key and value head widths are not supported"), "{e}");
    let e = edited("gpt-oss", |b| rename(b, "blk.0.attn_v.bias", "blk.0.ffn_up.bias"));
    assert!(e.ends_with("tensor blk.0.ffn_up.bias: this bias is not supported for gpt-oss"), "{e}");
    let e = edited("phi3", |b| patch_u32(b, "phi3.rope.dimension_count", 16));
    assert!(e.contains("inconsistent phi3 hyper-parameters") || e.contains("partial"), "{e}");
}

/// The test phi3 (6 rotated dims, 3 pairs) with LongRoPE.
fn phi3_longrope(seed: u64) -> HostModel {
    let mut a = family_arch("phi3");
    a.rope_scaling = Some(RopeScaling::LongRope {
        short_factor: vec![1.0, 1.75, 2.5],
        long_factor: vec![3.0, 5.0, 8.0],
        original_max_position_embeddings: 64,
        attention_factor: 1.190_238_3,
    });
    a.validate().expect("valid architecture");
    model(a, seed)
}

/// phi3's LongRoPE as llama.cpp's converter writes it (`Phi3MiniModel`): the tensors
/// `rope_factors_long.weight`/`rope_factors_short.weight` (`[3]` F32), the keys
/// `phi3.rope.scaling.original_context_length` and `phi3.rope.scaling.attn_factor` and no scaling
/// type; read back equal, also by gguf-py. Files with one factor tensor, and LongRoPE for another
/// architecture, are refused by name.
#[test]
fn phi3_longrope_round_trips_as_llama_cpp_stores_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = phi3_longrope(5);
    let path = write(dir.path(), "phi3", &m, &|_| None);
    let g = read(&path);
    assert_eq!(g.model, as_read_back(&m, "phi3"));
    let tensor = |name: &str| g.tensors.iter().find(|t| t.name == name).map(|t| (t.dtype, t.dims.clone()));
    for name in ["rope_factors_long.weight", "rope_factors_short.weight"] {
        assert_eq!(tensor(name), Some(("F32", vec![3])), "{name}");
    }
    assert_eq!(g.metadata.get("phi3.rope.scaling.original_context_length").and_then(GgufValue::as_u64), Some(64));
    assert_eq!(g.metadata.get("phi3.rope.scaling.attn_factor"), Some(&GgufValue::F32(1.190_238_3)));
    assert!(!g.metadata.contains_key("phi3.rope.scaling.type"));
    if let Some(python) = gguf_py() {
        let script = dir.path().join("dump.py");
        std::fs::write(&script, GGUF_PY_DUMP).expect("script");
        let out = std::process::Command::new(&python).arg(&script).arg(&path).output().expect("python");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let values = |name: &str| -> Vec<f64> {
            v["tensors"][name]["values"].as_array().expect("values").iter().filter_map(|x| x.as_f64()).collect()
        };
        assert_eq!(values("rope_factors_short.weight"), [1.0, 1.75, 2.5]);
        assert_eq!(values("rope_factors_long.weight"), [3.0, 5.0, 8.0]);
        assert_eq!(v["keys"]["phi3.rope.scaling.original_context_length"].as_u64(), Some(64));
        assert_eq!(v["keys"]["phi3.rope.scaling.attn_factor"].as_f64().map(|f| f as f32), Some(1.190_238_3));
        println!("gguf-py: phi3 LongRoPE factors and keys agree");
    }
    let mut bytes = std::fs::read(&path).expect("read");
    rename(&mut bytes, "rope_factors_long.weight", "rope_factors_lonX.weight");
    std::fs::write(&path, &bytes).expect("write");
    let e = read_gguf(&path).expect_err("refused").to_string();
    assert!(
        e.ends_with(
            "tensor rope_factors_long.weight is missing: LongRoPE needs both rope_factors_short and rope_factors_long"
        ),
        "{e}"
    );
    let mut m = model(family_arch("qwen3"), 1);
    m.arch.rope_scaling = Some(RopeScaling::LongRope {
        short_factor: vec![1.0; 8],
        long_factor: vec![2.0; 8],
        original_max_position_embeddings: 64,
        attention_factor: 1.2,
    });
    assert!(
        refusal(&m).contains("LongRoPE scaling for qwen3 (llama.cpp reads its factors for phi3)"),
        "{}",
        refusal(&m)
    );
}

/// The tiny-arch Phi-3 with LongRoPE in its `config.json` (Phi-4-mini's form) through GGUF: the
/// same architecture, factors and attention factor read back.
#[test]
fn tiny_phi3_longrope_round_trips_through_gguf() {
    let Some(src) = tiny_arch("phi3") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).expect("dir");
    for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), hf.join(f)).expect("copy");
    }
    let mut c: serde_json::Value =
        serde_json::from_slice(&std::fs::read(hf.join("config.json")).expect("config")).expect("json");
    c["rope_parameters"] = serde_json::json!({"rope_type": "longrope", "rope_theta": 10000.0,
        "partial_rotary_factor": 0.75, "short_factor": [1.0, 1.5, 2.0, 2.5, 3.0, 3.5],
        "long_factor": [2.0, 3.0, 5.0, 8.0, 13.0, 21.0]});
    c["original_max_position_embeddings"] = serde_json::json!(64);
    c["max_position_embeddings"] = serde_json::json!(512);
    std::fs::write(hf.join("config.json"), serde_json::to_vec(&c).expect("json")).expect("write");
    let loaded = qdrift_load::open_model(&hf, None).unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(loaded.model.arch.rope_scaling, Some(RopeScaling::LongRope { .. })));
    let keys = qdrift_load::write::gguf_tokenizer_keys(&loaded).unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("phi3.gguf");
    write_gguf_with(&path, &loaded.model, &keys, WriteDtype::F32, &|_| None).unwrap_or_else(|e| panic!("{e}"));
    let g = read(&path);
    assert_eq!(g.model.arch, as_read_back(&loaded.model, "phi3").arch);
    assert!(g.model == as_read_back(&loaded.model, "phi3"), "the weights read back differ");
}

/// Layers whose windows are not llama.cpp's default pattern are written as the per-layer
/// `attention.sliding_window_pattern` booleans and read back as they were.
#[test]
fn sliding_window_patterns_round_trip() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (family, windows) in [
        ("gemma2", vec![None, Some(16), None, Some(16)]),
        ("gemma2", vec![None; 4]),
        ("gpt-oss", vec![Some(8); 4]),
        ("gemma3", vec![None; 6]),
    ] {
        let mut m = model(family_arch(family), 4);
        m.arch.windows = if windows.iter().all(Option::is_none) { Vec::new() } else { windows.clone() };
        if m.arch.windows.is_empty() && family == "gemma3" {
            m.arch.local_rope_theta = None;
            m.arch.rope_scaling = None;
        }
        let g = read(&write(dir.path(), family, &m, &|_| None));
        assert_eq!(g.model, as_read_back(&m, family), "{family} {windows:?}");
        let pattern = g.metadata.get(&format!("{family}.attention.sliding_window_pattern"));
        assert_eq!(pattern.is_some(), family != "gemma3", "{family} {windows:?}");
    }
}

/// Reads a GGUF file with gguf-py (`gguf` 0.19.0, llama.cpp's own reader) and prints every
/// key's value and every tensor's name, type, shape and f32 values (dequantized by gguf-py's
/// numpy code), one JSON document.
const GGUF_PY_DUMP: &str = r#"
import json, sys
import numpy as np
from gguf import GGUFReader, GGUFValueType, quants
r = GGUFReader(sys.argv[1])
keys = {}
for f in r.fields.values():
    if f.name.startswith("GGUF."):
        continue
    v = f.contents()
    keys[f.name] = v if not isinstance(v, float) else float(np.float32(v))
tensors = {}
for t in r.tensors:
    vals = quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
    tensors[t.name] = {"type": t.tensor_type.name, "shape": [int(x) for x in t.shape], "values": [float(x) for x in vals]}
print(json.dumps({"keys": keys, "tensors": tensors}))
"#;

fn gguf_py() -> Option<PathBuf> {
    let python = std::env::var_os("QDRIFT_GGUF_PY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/gguf-venv/bin/python"));
    let ok = std::process::Command::new(&python)
        .args([
            "-c",
            "import gguf, numpy; assert gguf.__version__ == '0.19.0' if hasattr(gguf, '__version__') else True",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        Some(python)
    } else {
        println!(
            "skipped: no gguf-py at {} (python3 -m venv /var/tmp/gguf-venv && /var/tmp/gguf-venv/bin/pip install \
             gguf==0.19.0, or set QDRIFT_GGUF_PY)",
            python.display()
        );
        None
    }
}

/// gguf-py reads every family's file (F32, and Q8_0/MXFP4 blocks): the same keys with the same
/// values as qdrift's reader sees, every tensor with the same name, dims and values.
#[test]
fn gguf_py_reads_every_family() {
    let Some(python) = gguf_py() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("dump.py");
    std::fs::write(&script, GGUF_PY_DUMP).expect("script");
    for family in FAMILIES {
        let m = model(family_arch(family), 9);
        let store = |g: GgufMatrix| {
            let t = match g {
                GgufMatrix::Linear { layer, short_name } if short_name.expert.is_some() => {
                    m.layers[layer].linears().into_iter().find(|(n, _)| *n == short_name).expect("linear").1.clone()
                }
                _ => return None,
            };
            Some(GgufStored {
                ggml_type: GgmlType::Mxfp4.gguf_id(),
                bytes: quantize_ggml_blocks(GgmlType::Mxfp4, &t.data).expect("q"),
            })
        };
        let path = write(dir.path(), family, &m, &store);
        let g = read(&path);
        let out = std::process::Command::new(&python).arg(&script).arg(&path).output().expect("python");
        assert!(out.status.success(), "{family}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let keys = v["keys"].as_object().expect("keys");
        assert_eq!(keys.len(), g.metadata.len(), "{family}");
        for (k, val) in &g.metadata {
            let py = &keys[k];
            match val {
                GgufValue::String(s) => assert_eq!(py.as_str(), Some(s.as_str()), "{family} {k}"),
                GgufValue::F32(x) => assert_eq!(py.as_f64().map(|f| f as f32), Some(*x), "{family} {k}"),
                GgufValue::Array(a) => assert_eq!(py.as_array().map(Vec::len), Some(a.len()), "{family} {k}"),
                GgufValue::Bool(b) => assert_eq!(py.as_bool(), Some(*b), "{family} {k}"),
                other => assert_eq!(py.as_u64(), other.as_u64(), "{family} {k}"),
            }
        }
        let tensors = v["tensors"].as_object().expect("tensors");
        assert_eq!(tensors.len(), g.tensors.len(), "{family}");
        let bytes = std::fs::read(&path).expect("file");
        for t in &g.tensors {
            let py = &tensors[&t.name];
            assert_eq!(py["type"].as_str(), Some(t.dtype), "{family} {}", t.name);
            let dims: Vec<u64> = py["shape"].as_array().expect("shape").iter().filter_map(|x| x.as_u64()).collect();
            assert_eq!(dims, t.dims, "{family} {}", t.name);
            let values: Vec<f32> = py["values"]
                .as_array()
                .expect("values")
                .iter()
                .map(|x| x.as_f64().unwrap_or(f64::NAN) as f32)
                .collect();
            assert_eq!(values.len() as u64, t.elements, "{family} {}", t.name);
            // F32 tensors: gguf-py's values are the file's bytes.
            if t.dtype == "F32" {
                let raw: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
                assert!(bytes.windows(raw.len().max(1)).any(|w| w == raw.as_slice()), "{family} {}", t.name);
            }
        }
        // The experts as gguf-py dequantizes them equal qdrift's read-back.
        if let Some(e) = g.model.layers[0].experts() {
            let py: Vec<f32> = tensors["blk.0.ffn_up_exps.weight"]["values"]
                .as_array()
                .expect("values")
                .iter()
                .map(|x| x.as_f64().unwrap_or(f64::NAN) as f32)
                .collect();
            let ours: Vec<f32> = e.experts.iter().flat_map(|m| m.up.data.iter().copied()).collect();
            assert_eq!(py, ours, "{family}");
        }
        println!("gguf-py: {family}: {} keys, {} tensors agree", g.metadata.len(), g.tensors.len());
    }
}

fn tiny_arch(name: &str) -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/tiny-arch").join(name);
    if dir.join("config.json").is_file() {
        Some(dir)
    } else {
        println!("skipped: {} is absent", dir.display());
        None
    }
}

/// The tiny-arch checkpoints of `../shared` (`transformers` 5.25.0, bf16), read by the Hugging
/// Face reader, written as GGUF (F32, the tokenizer converted as llama.cpp's converter does) and
/// read back: the same model, but for what GGUF states differently (llama.cpp's architecture name,
/// Gemma's `1 + w` norms, `sqrtf(n_embd)` as the embedding scale, gpt-oss's head untied and its
/// YaRN correction dims truncated, as llama.cpp computes them).
#[test]
fn tiny_arch_hf_checkpoints_round_trip_through_gguf() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (folder, family) in [
        ("qwen3", "qwen3"),
        ("qwen3_moe", "qwen3moe"),
        ("gemma2", "gemma2"),
        ("gemma3", "gemma3"),
        ("phi3", "phi3"),
        ("gpt_oss", "gpt-oss"),
        ("mixtral", "mixtral"),
        ("smollm3", "smollm3"),
        ("glm4_moe", "glm4moe"),
    ] {
        let Some(src) = tiny_arch(folder) else { continue };
        let loaded = qdrift_load::open_model(&src, None).unwrap_or_else(|e| panic!("{folder}: {e}"));
        let keys = qdrift_load::write::gguf_tokenizer_keys(&loaded).unwrap_or_else(|e| panic!("{folder}: {e}"));
        let path = dir.path().join(format!("{folder}.gguf"));
        let written = write_gguf_with(&path, &loaded.model, &keys, WriteDtype::F32, &|_| None);
        if folder == "gemma2" && loaded.model.output.as_ref().is_some_and(|o| *o != loaded.model.token_embedding) {
            // The tiny Gemma 2 has an untied head (`tie_word_embeddings: false`); llama.cpp's
            // gemma2 always uses the embedding (its converter drops `lm_head.weight`).
            let e = written.expect_err("refused").to_string();
            assert!(e.ends_with("an untied output head (llama.cpp's gemma2 always uses the embedding)"), "{e}");
            println!("{folder}: refused: {e}");
            continue;
        }
        written.unwrap_or_else(|e| panic!("{folder}: {e}"));
        let g = read(&path);
        let mut want = as_read_back(&loaded.model, family);
        if want.arch.embedding_scale.is_some() {
            want.arch.embedding_scale = Some((want.arch.dim as f32).sqrt());
        }
        if family == "gpt-oss" {
            if let Some(RopeScaling::Yarn { truncate, .. }) = &mut want.arch.rope_scaling {
                *truncate = true;
            }
            if want.output.is_none() {
                want.output = Some(want.token_embedding.clone());
                want.arch.tied_embeddings = false;
            }
        }
        assert_eq!(g.model.arch, want.arch, "{folder}");
        assert!(g.model == want, "{folder}: the weights read back differ");
        // The tokenizer written encodes as the folder's.
        let tok = qdrift_load::open_model(&path, None).expect("gguf").tokenizer;
        let golden: serde_json::Value =
            serde_json::from_slice(&std::fs::read(src.join("golden.json")).expect("golden")).expect("json");
        for (text, ids) in
            golden["texts"].as_array().expect("texts").iter().zip(golden["prompts"].as_array().expect("p"))
        {
            let want: Vec<u32> =
                ids.as_array().expect("ids").iter().filter_map(|v| v.as_u64()).map(|v| v as u32).collect();
            assert_eq!(tok.encode(text.as_str().expect("text")), want, "{folder}");
        }
        println!("{folder}: HF -> GGUF {family} -> read back equal");
    }
}

/// A Llama block whose head width is not dim / n_heads (Mistral NeMo's shape) is written as
/// `llama` with `attention.key_length`/`value_length` and read back equal; the Hugging Face
/// writer still refuses it (its `config.json` has no `head_dim`).
#[test]
fn llama_with_an_explicit_head_width_round_trips() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = model(base_arch("llama"), 12);
    let g = read(&write(dir.path(), "llama", &m, &|_| None));
    assert_eq!(g.model, m);
    assert_eq!(g.metadata.get("llama.attention.key_length").and_then(GgufValue::as_u64), Some(16));
    assert!(!g.metadata.contains_key("llama.expert_count"));
}

/// A block past `{arch}.block_count` is refused naming its first tensor, before any weight is
/// read (qwen3's reader refused it only as an unused tensor, after reading every block).
#[test]
fn a_block_past_the_block_count_is_refused() {
    let e = edited("qwen3", |b| patch_u32(b, "qwen3.block_count", 1));
    assert!(
        e.contains(": tensor blk.1.")
            && e.ends_with(" is in block 1, but qwen3.block_count is 1; qdrift would run without it"),
        "{e}"
    );
}

/// llama.cpp's smollm3 fixes its NoPE layers (every 4th); another pattern is refused, and Llama 4's
/// files are refused by the feature qdrift does not write yet.
#[test]
fn nope_patterns_and_unwritten_families_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (folder, edit, needle) in [
        ("smollm3", true, "its NoPE layers are not llama.cpp's (every 4th layer, no other)"),
        ("llama4", false, "NoPE, chunked or temperature-tuned attention layers are not written yet"),
    ] {
        let Some(src) = tiny_arch(folder) else { continue };
        let mut m = qdrift_load::open_model(&src, None).unwrap_or_else(|e| panic!("{folder}: {e}")).model;
        if edit {
            m.arch.layer_attention.rope = vec![true, false, true, true];
        }
        let path = dir.path().join(format!("{folder}.gguf"));
        let e = write_gguf_with(&path, &m, &[], WriteDtype::F32, &|_| None).expect_err("refused").to_string();
        assert!(e.ends_with(needle), "{folder}: {e}");
    }
}

/// The tiny GLM-4.5 written as `glm4moe`: its file, for edits.
fn tiny_glm4moe(dir: &Path, edit: impl FnOnce(&mut HostModel)) -> Option<PathBuf> {
    let src = tiny_arch("glm4_moe")?;
    let mut m = qdrift_load::open_model(&src, None).expect("glm4_moe").model;
    edit(&mut m);
    let path = dir.join("glm4moe.gguf");
    write_gguf_with(&path, &m, &[], WriteDtype::F32, &|_| None).expect("written");
    Some(path)
}

/// llama.cpp's glm4moe routing keys that qdrift cannot run, or that contradict the experts, are
/// refused by their names: groups that do not split the 8 experts, kept groups that cannot hold
/// the top-k, a gating function other than sigmoid; the written file states llama.cpp's keys.
#[test]
fn glm4moe_bad_group_keys_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(path) = tiny_glm4moe(dir.path(), |_| {}) else { return };
    let clean = std::fs::read(&path).expect("read");
    let meta = read_gguf_metadata(&path).expect("metadata");
    for (key, want) in [
        ("expert_gating_func", GgufValue::U32(2)),
        ("expert_group_count", GgufValue::U32(1)),
        ("expert_group_used_count", GgufValue::U32(1)),
        ("leading_dense_block_count", GgufValue::U32(1)),
        ("expert_shared_count", GgufValue::U32(1)),
        ("expert_feed_forward_length", GgufValue::U32(32)),
        ("expert_weights_scale", GgufValue::F32(1.5)),
        ("expert_weights_norm", GgufValue::Bool(true)),
        ("nextn_predict_layers", GgufValue::U32(0)),
        ("rope.dimension_count", GgufValue::U32(8)),
    ] {
        assert_eq!(meta.get(&format!("glm4moe.{key}")), Some(&want), "{key}");
    }
    let cases: [(&[(&str, u32)], &str); 4] = [
        (
            &[("expert_group_count", 3)],
            "glm4moe.expert_group_count is 3: the groups must split the 8 experts evenly, at least 2 to a group",
        ),
        (
            &[("expert_group_count", 8)],
            "glm4moe.expert_group_count is 8: the groups must split the 8 experts evenly, at least 2 to a group",
        ),
        (
            &[("expert_group_count", 4), ("expert_group_used_count", 0)],
            "glm4moe.expert_group_used_count is 0: from 1 to the 4 groups, whose experts must hold the 2 chosen \
             (expert_used_count)",
        ),
        (&[("expert_gating_func", 1)], "glm4moe.expert_gating_func is 1: only sigmoid gating (2) is supported"),
    ];
    for (patches, want) in cases {
        let mut bytes = clean.clone();
        for (key, value) in patches {
            patch_u32(&mut bytes, &format!("glm4moe.{key}"), *value);
        }
        std::fs::write(&path, &bytes).expect("write");
        let e = read_gguf(&path).map(|_| ()).expect_err("refused").to_string();
        assert!(e.ends_with(want), "{patches:?}: {e}");
    }
    // Groups that do hold the top-k are read as the grouped router.
    let mut bytes = clean.clone();
    patch_u32(&mut bytes, "glm4moe.expert_group_count", 4);
    patch_u32(&mut bytes, "glm4moe.expert_group_used_count", 2);
    std::fs::write(&path, &bytes).expect("write");
    let routing = read(&path).model.arch.moe.expect("experts").routing;
    assert_eq!(routing, Routing::GroupedSigmoid { n_group: 4, topk_group: 2, renormalize: true, scale: 1.5 });
}

/// A glm4moe file whose last block is an MTP layer (`nextn_predict_layers` 1, as llama.cpp's
/// converter writes GLM-4.5) is read as the blocks before it: the MTP block's tensors are skipped.
#[test]
fn glm4moe_mtp_blocks_are_skipped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(plain) = tiny_glm4moe(dir.path(), |_| {}) else { return };
    let want = read(&plain).model;
    let Some(path) = tiny_glm4moe(dir.path(), |m| {
        let last = m.layers.last().expect("layers").clone();
        m.layers.push(last);
        m.arch.n_layers += 1;
    }) else {
        return;
    };
    let mut bytes = std::fs::read(&path).expect("read");
    patch_u32(&mut bytes, "glm4moe.nextn_predict_layers", 1);
    std::fs::write(&path, &bytes).expect("write");
    let got = read(&path).model;
    assert_eq!(got.arch, want.arch);
    assert!(got == want, "the model's blocks read back differ");
    patch_u32(&mut bytes, "glm4moe.nextn_predict_layers", 5);
    std::fs::write(&path, &bytes).expect("write");
    let e = read_gguf(&path).map(|_| ()).expect_err("refused").to_string();
    assert!(
        e.ends_with("glm4moe.nextn_predict_layers is 5 but glm4moe.block_count is 5: no block is left to run"),
        "{e}"
    );
}

/// The tiny GLM-4.5's file holds gguf-py 0.19.0's `MODEL_TENSORS[MODEL_ARCH.GLM4_MOE]` names as
/// llama.cpp's `glm4moe` loader creates them: a dense leading block, then blocks with the router,
/// its selection bias `exp_probs_b.bias`, the stacked experts and the ungated shared experts.
#[test]
fn glm4moe_tensors_have_llama_cpps_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(path) = tiny_glm4moe(dir.path(), |_| {}) else { return };
    let g = read(&path);
    let names: BTreeSet<&str> = g.tensors.iter().map(|t| t.name.as_str()).collect();
    let attention = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm"]
        .map(|t| format!("{t}.weight"))
        .into_iter()
        .chain(["attn_q.bias", "attn_k.bias", "attn_v.bias", "post_attention_norm.weight"].map(String::from));
    let dense = ["ffn_gate", "ffn_up", "ffn_down"].map(|t| format!("{t}.weight"));
    let moe = ["ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
        .into_iter()
        .chain(["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"])
        .map(|t| format!("{t}.weight"))
        .chain(["exp_probs_b.bias".to_string()]);
    let mut want: BTreeSet<String> =
        ["token_embd.weight", "output_norm.weight", "output.weight"].map(String::from).into_iter().collect();
    for i in 0..g.model.arch.n_layers {
        let ffn: Vec<String> = if i == 0 { dense.to_vec() } else { moe.clone().collect() };
        want.extend(attention.clone().chain(ffn).map(|t| format!("blk.{i}.{t}")));
    }
    assert_eq!(names, want.iter().map(String::as_str).collect::<BTreeSet<_>>());
}
