//! The Hugging Face reader on `../shared/models/tiny-arch/` (one small random checkpoint per
//! architecture that `transformers` 5.25.0 wrote, see its README): every folder opens, its
//! [`ModelArch`] is what `config.json` says, its tensors land where the layout invariant puts
//! them (checked against the safetensors files read independently), its tokenizer encodes the
//! goldens' prompts; and every refused feature is refused in one line that names it.

use std::path::{Path, PathBuf};

use qdrift_load::{
    Activation, Ffn, HostTensor, LoadedModel, ModelArch, NormStyle, RopeScaling, Routing, open_model,
    rotate_half_row_order, rotate_half_row_order_partial,
};
use serde_json::Value;

const ARCHES: [&str; 7] = ["qwen3", "qwen3_moe", "gemma2", "gemma3", "phi3", "mixtral", "gpt_oss"];

fn tiny_dir(arch: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models/tiny-arch").join(arch)
}

fn open(arch: &str) -> LoadedModel {
    open_model(&tiny_dir(arch), None).unwrap_or_else(|e| panic!("{arch}: {e}"))
}

/// The tensors of a folder's `model.safetensors`, read with the `safetensors` crate (BF16 → f32).
struct Raw(Vec<u8>);

impl Raw {
    fn of(arch: &str) -> Raw {
        Raw(std::fs::read(tiny_dir(arch).join("model.safetensors")).expect("model.safetensors"))
    }

    fn get(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let st = safetensors::SafeTensors::deserialize(&self.0).expect("valid");
        let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(t.dtype(), safetensors::Dtype::BF16, "{name}");
        let data = t.data().chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
        (t.shape().to_vec(), data)
    }

    fn data(&self, name: &str) -> Vec<f32> {
        self.get(name).1
    }
}

/// Row `r` of a `[rows, cols]` tensor.
fn row(t: &HostTensor, r: usize) -> &[f32] {
    let cols = t.shape[1];
    &t.data[r * cols..(r + 1) * cols]
}

fn raw_row(data: &[f32], cols: usize, r: usize) -> &[f32] {
    &data[r * cols..(r + 1) * cols]
}

/// `loaded` is `raw` (`[rows, cols]`, rotate-half) with each rotate-half row `r` at interleaved
/// row `order[r]`.
fn assert_permuted(loaded: &HostTensor, raw: &[f32], order: &[usize], what: &str) {
    let cols = loaded.data.len() / order.len();
    for (r, &o) in order.iter().enumerate() {
        assert_eq!(&loaded.data[o * cols..(o + 1) * cols], raw_row(raw, cols, r), "{what}: rotate-half row {r}");
    }
}

fn golden(arch: &str) -> Value {
    serde_json::from_slice(&std::fs::read(tiny_dir(arch).join("golden.json")).expect("golden.json")).expect("json")
}

#[test]
fn every_tiny_arch_opens_and_encodes_the_golden_prompts() {
    for arch in ARCHES {
        let m = open(arch);
        let g = golden(arch);
        assert_eq!(m.model.arch.architecture, g["architecture"].as_str().expect("architecture"), "{arch}");
        let texts = g["texts"].as_array().expect("texts");
        let prompts = g["prompts"].as_array().expect("prompts");
        assert_eq!(texts.len(), 3, "{arch}");
        for (t, p) in texts.iter().zip(prompts) {
            let want: Vec<u32> = p.as_array().expect("ids").iter().map(|v| v.as_u64().expect("id") as u32).collect();
            assert_eq!(m.tokenizer.encode(t.as_str().expect("text")), want, "{arch}: {t}");
        }
        assert_eq!(m.model.layers.len(), m.model.arch.n_layers, "{arch}");
        assert_eq!(m.tokenizer.eos_id(), Some(0), "{arch}");
    }
}

/// transformers ≥ 4.43 saves a model's chat template as `chat_template.jinja` beside
/// `tokenizer_config.json`: the reader takes it when the config has none, as the GGUF export does.
#[test]
fn a_chat_template_jinja_file_is_the_models_template() {
    let dir = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(tiny_dir("qwen3")).expect("qwen3") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).expect("copy");
    }
    assert_eq!(open_model(dir.path(), None).expect("opens").chat_template, None);
    let template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}";
    std::fs::write(dir.path().join("chat_template.jinja"), template).expect("write");
    assert_eq!(open_model(dir.path(), None).expect("opens").chat_template.as_deref(), Some(template));
}

/// The shapes all seven share: hidden 64, 4 query heads, 2 key/value heads, vocab 512.
fn common(a: &ModelArch, head_dim: usize, layers: usize) {
    assert_eq!((a.dim, a.n_heads, a.n_kv_heads, a.vocab_size), (64, 4, 2, 512));
    assert_eq!((a.head_dim, a.n_layers, a.max_seq_len), (head_dim, layers, 4096));
    assert_eq!(a.norm_eps, 1e-6);
}

#[test]
fn qwen3_config_and_q_k_norms_permuted_like_the_q_k_rows() {
    let m = open("qwen3");
    let a = &m.model.arch;
    common(a, 32, 4);
    assert_eq!((a.rope_theta, &a.rope_scaling, a.tied_embeddings), (1e6, &None, false));
    assert!(a.block.qk_norm && a.block.norm == NormStyle::Weight && !a.block.sandwich_norms);
    assert_eq!((a.block.rotary_dim, a.block.attn_scale, a.block.activation), (None, None, Activation::SwiGlu));
    assert!(a.windows.is_empty() && a.moe.is_none() && a.embedding_scale.is_none());
    let raw = Raw::of("qwen3");
    let one_head = rotate_half_row_order(1, 32);
    for (i, l) in m.model.layers.iter().enumerate() {
        let p = format!("model.layers.{i}.self_attn");
        let q_norm = l.q_norm.as_ref().expect("q_norm");
        assert_permuted(q_norm, &raw.data(&format!("{p}.q_norm.weight")), &one_head, "q_norm");
        assert_permuted(
            l.k_norm.as_ref().expect("k_norm"),
            &raw.data(&format!("{p}.k_norm.weight")),
            &one_head,
            "k_norm",
        );
        assert_permuted(&l.wq, &raw.data(&format!("{p}.q_proj.weight")), &rotate_half_row_order(4, 32), "wq");
        assert_permuted(&l.wk, &raw.data(&format!("{p}.k_proj.weight")), &rotate_half_row_order(2, 32), "wk");
        // The norm weight of a dimension moves with that dimension's q rows, in every head.
        let (raw_q, raw_q_norm) = (raw.data(&format!("{p}.q_proj.weight")), raw.data(&format!("{p}.q_norm.weight")));
        for h in 0..4 {
            for (d, &at) in one_head.iter().enumerate() {
                assert_eq!(row(&l.wq, h * 32 + at), raw_row(&raw_q, 64, h * 32 + d));
                assert_eq!(q_norm.data[at], raw_q_norm[d]);
            }
        }
        assert!(l.bq.is_none() && l.bo.is_none() && l.post_attn_norm.is_none() && l.sinks.is_none());
        assert_eq!(l.ffn_norm.data, raw.data(&format!("model.layers.{i}.post_attention_layernorm.weight")));
        let mlp = l.mlp().expect("dense");
        assert_eq!(mlp.gate.data, raw.data(&format!("model.layers.{i}.mlp.gate_proj.weight")));
    }
    assert_eq!(m.model.output.as_ref().expect("untied").data, raw.data("lm_head.weight"));
}

#[test]
fn qwen3_moe_experts_and_router() {
    let m = open("qwen3_moe");
    let a = &m.model.arch;
    common(a, 32, 4);
    let moe = a.moe.as_ref().expect("moe");
    assert_eq!((moe.n_experts, moe.top_k, moe.expert_hidden), (8, 2, 32));
    assert_eq!(moe.routing, Routing::SoftmaxTopK { renormalize: true });
    assert!(moe.dense_layers.is_empty() && a.block.qk_norm && a.windows.is_empty());
    let raw = Raw::of("qwen3_moe");
    for (i, l) in m.model.layers.iter().enumerate() {
        let e = l.experts().expect("experts");
        let p = format!("model.layers.{i}.mlp");
        assert_eq!((e.router.shape.as_slice(), &e.router.data), (&[8, 64][..], &raw.data(&format!("{p}.gate.weight"))));
        assert!(e.router_bias.is_none());
        assert_eq!(e.experts.len(), 8);
        for (k, x) in e.experts.iter().enumerate() {
            assert_eq!(x.gate.data, raw.data(&format!("{p}.experts.{k}.gate_proj.weight")));
            assert_eq!(x.up.data, raw.data(&format!("{p}.experts.{k}.up_proj.weight")));
            assert_eq!(
                (x.down.shape.as_slice(), &x.down.data),
                (&[64, 32][..], &raw.data(&format!("{p}.experts.{k}.down_proj.weight")))
            );
            assert!(x.gate_bias.is_none());
        }
    }
}

/// Gemma's four norms: `post_attention_layernorm` is the attention output's, the pre-FFN norm
/// is `pre_feedforward_layernorm`.
fn assert_gemma_norms(m: &LoadedModel, arch: &str) {
    let raw = Raw::of(arch);
    for (i, l) in m.model.layers.iter().enumerate() {
        let n = |s: &str| raw.data(&format!("model.layers.{i}.{s}.weight"));
        assert_eq!(l.attn_norm.data, n("input_layernorm"));
        assert_eq!(l.post_attn_norm.as_ref().expect("post-attn").data, n("post_attention_layernorm"));
        assert_eq!(l.ffn_norm.data, n("pre_feedforward_layernorm"));
        assert_eq!(l.post_ffn_norm.as_ref().expect("post-ffn").data, n("post_feedforward_layernorm"));
    }
}

#[test]
fn gemma2_config_and_norms() {
    let m = open("gemma2");
    let a = &m.model.arch;
    common(a, 32, 4);
    let b = &a.block;
    assert!(b.sandwich_norms && !b.qk_norm && !b.sinks);
    assert_eq!((b.norm, b.activation), (NormStyle::OnePlusWeight, Activation::GeluTanh));
    assert_eq!((b.attn_scale, b.attn_softcap, a.final_logit_softcap), (Some(32f32.powf(-0.5)), Some(5.0), Some(4.0)));
    assert_eq!(a.embedding_scale, Some(8.0));
    assert_eq!(a.windows, [Some(16), None, Some(16), None]);
    assert_eq!((a.rope_theta, a.local_rope_theta, &a.rope_scaling), (10000.0, None, &None));
    // config.json says tie_word_embeddings false (the class default is true).
    assert!(!a.tied_embeddings && m.model.output.is_some());
    assert_gemma_norms(&m, "gemma2");
}

#[test]
fn gemma3_config_norms_and_q_k_norms() {
    let m = open("gemma3");
    let a = &m.model.arch;
    common(a, 32, 6);
    let b = &a.block;
    assert!(b.sandwich_norms && b.qk_norm);
    assert_eq!((b.norm, b.activation), (NormStyle::OnePlusWeight, Activation::GeluTanh));
    // transformers 5.25's Gemma 3 has no attention-logit cap.
    assert_eq!((b.attn_scale, b.attn_softcap, a.final_logit_softcap), (Some(32f32.powf(-0.5)), None, Some(4.0)));
    assert_eq!(a.windows, [Some(16), Some(16), Some(16), Some(16), Some(16), None]);
    assert_eq!((a.rope_theta, a.local_rope_theta, &a.rope_scaling), (1e6, Some(1e4), &None));
    assert_eq!((a.layer_rope(0).0, a.layer_rope(5).0), (1e4, 1e6));
    assert_eq!(a.embedding_scale, Some(8.0));
    assert_gemma_norms(&m, "gemma3");
    let raw = Raw::of("gemma3");
    let k_norm = m.model.layers[2].k_norm.as_ref().expect("k_norm");
    assert_permuted(
        k_norm,
        &raw.data("model.layers.2.self_attn.k_norm.weight"),
        &rotate_half_row_order(1, 32),
        "k_norm",
    );
}

#[test]
fn phi3_fused_projections_are_split_and_partial_rotary_permuted() {
    let m = open("phi3");
    let a = &m.model.arch;
    common(a, 16, 4);
    assert_eq!((a.block.rotary_dim, a.rotary_dim(), a.rope_theta), (Some(12), 12, 10000.0));
    assert!(a.tied_embeddings && m.model.output.is_none() && a.windows.is_empty());
    let raw = Raw::of("phi3");
    for (i, l) in m.model.layers.iter().enumerate() {
        let (shape, qkv) = raw.get(&format!("model.layers.{i}.self_attn.qkv_proj.weight"));
        assert_eq!(shape, [128, 64]);
        // [q (64 rows); k (32); v (32)], q and k permuted within the first 12 rows of each head.
        assert_permuted(&l.wq, &qkv[..64 * 64], &rotate_half_row_order_partial(4, 16, 12), "wq");
        assert_permuted(&l.wk, &qkv[64 * 64..96 * 64], &rotate_half_row_order_partial(2, 16, 12), "wk");
        assert_eq!(l.wv.data, &qkv[96 * 64..]);
        // Rows 12..16 of a head are not rotated and stay.
        assert_eq!(row(&l.wq, 16 + 13), raw_row(&qkv, 64, 16 + 13));
        let (shape, gate_up) = raw.get(&format!("model.layers.{i}.mlp.gate_up_proj.weight"));
        assert_eq!(shape, [256, 64]);
        let mlp = l.mlp().expect("dense");
        assert_eq!((mlp.gate.shape.as_slice(), &mlp.gate.data[..]), (&[128, 64][..], &gate_up[..128 * 64]));
        assert_eq!(mlp.up.data, &gate_up[128 * 64..]);
        assert_eq!(mlp.down.data, raw.data(&format!("model.layers.{i}.mlp.down_proj.weight")));
        assert_eq!(l.ffn_norm.data, raw.data(&format!("model.layers.{i}.post_attention_layernorm.weight")));
    }
}

#[test]
fn mixtral_experts_w1_w3_w2() {
    let m = open("mixtral");
    let a = &m.model.arch;
    common(a, 16, 4);
    let moe = a.moe.as_ref().expect("moe");
    assert_eq!((moe.n_experts, moe.top_k, moe.expert_hidden), (8, 2, 64));
    assert_eq!(moe.routing, Routing::SoftmaxTopK { renormalize: true });
    assert_eq!((a.rope_theta, a.windows.len()), (1e6, 0));
    let raw = Raw::of("mixtral");
    let l = &m.model.layers[3];
    let e = l.experts().expect("experts");
    let p = "model.layers.3.block_sparse_moe";
    assert_eq!(e.router.data, raw.data(&format!("{p}.gate.weight")));
    for (k, x) in e.experts.iter().enumerate() {
        assert_eq!(x.gate.data, raw.data(&format!("{p}.experts.{k}.w1.weight")));
        assert_eq!(x.up.data, raw.data(&format!("{p}.experts.{k}.w3.weight")));
        assert_eq!(x.down.data, raw.data(&format!("{p}.experts.{k}.w2.weight")));
    }
}

#[test]
fn gpt_oss_yarn_sinks_biases_and_interleaved_experts() {
    let m = open("gpt_oss");
    let a = &m.model.arch;
    common(a, 32, 4);
    assert_eq!(a.block.activation, Activation::ClampedSwiGlu { alpha: 1.702, limit: 7.0 });
    assert!(a.block.sinks && !a.block.qk_norm && !a.block.sandwich_norms);
    assert_eq!(a.windows, [Some(16), None, Some(16), None]);
    assert_eq!(a.rope_theta, 150000.0);
    let Some(RopeScaling::Yarn {
        factor,
        beta_fast,
        beta_slow,
        original_max_position_embeddings,
        truncate,
        attention_factor,
    }) = a.rope_scaling.clone()
    else {
        panic!("yarn: {:?}", a.rope_scaling)
    };
    assert_eq!(
        (factor, beta_fast, beta_slow, original_max_position_embeddings, truncate),
        (32.0, 32.0, 1.0, 4096, false)
    );
    // arch-spec §8: 0.1·ln 32 + 1 = 1.3465735902799727.
    assert_eq!(attention_factor, 1.346_573_6);
    let moe = a.moe.as_ref().expect("moe");
    assert_eq!((moe.n_experts, moe.top_k, moe.expert_hidden, moe.routing), (8, 2, 32, Routing::TopKSoftmax));
    let raw = Raw::of("gpt_oss");
    for (i, l) in m.model.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        assert_eq!(l.sinks.as_ref().expect("sinks").data, raw.data(&format!("{p}.self_attn.sinks")));
        let bq = l.bq.as_ref().expect("bq");
        let raw_bq = raw.data(&format!("{p}.self_attn.q_proj.bias"));
        let order = rotate_half_row_order(4, 32);
        (0..128).for_each(|r| assert_eq!(bq.data[order[r]], raw_bq[r]));
        assert_eq!(l.bv.as_ref().expect("bv").data, raw.data(&format!("{p}.self_attn.v_proj.bias")));
        assert_eq!(l.bo.as_ref().expect("bo").data, raw.data(&format!("{p}.self_attn.o_proj.bias")));
        assert_eq!(l.ffn_norm.data, raw.data(&format!("{p}.post_attention_layernorm.weight")));
        let Ffn::Experts(e) = &l.ffn else { panic!("experts") };
        assert_eq!(e.router.data, raw.data(&format!("{p}.mlp.router.weight")));
        assert_eq!(e.router_bias.as_ref().expect("router bias").data, raw.data(&format!("{p}.mlp.router.bias")));
        let gu = raw.data(&format!("{p}.mlp.experts.gate_up_proj")); // [8, 64, 64]: [E, in, out]
        let gub = raw.data(&format!("{p}.mlp.experts.gate_up_proj_bias")); // [8, 64]
        let dn = raw.data(&format!("{p}.mlp.experts.down_proj")); // [8, 32, 64]
        let dnb = raw.data(&format!("{p}.mlp.experts.down_proj_bias")); // [8, 64]
        for (k, x) in e.experts.iter().enumerate() {
            assert_eq!((x.gate.shape.as_slice(), x.down.shape.as_slice()), (&[32, 64][..], &[64, 32][..]));
            for j in 0..32 {
                for h in 0..64 {
                    assert_eq!(x.gate.data[j * 64 + h], gu[k * 64 * 64 + h * 64 + 2 * j]);
                    assert_eq!(x.up.data[j * 64 + h], gu[k * 64 * 64 + h * 64 + 2 * j + 1]);
                    assert_eq!(x.down.data[h * 32 + j], dn[k * 32 * 64 + j * 64 + h]);
                }
                assert_eq!(x.gate_bias.as_ref().expect("gate bias").data[j], gub[k * 64 + 2 * j]);
                assert_eq!(x.up_bias.as_ref().expect("up bias").data[j], gub[k * 64 + 2 * j + 1]);
            }
            assert_eq!(x.down_bias.as_ref().expect("down bias").data, &dnb[k * 64..(k + 1) * 64]);
        }
    }
}

/// A copy of tiny-arch folder `arch` whose `config.json` is edited by `edit`.
fn edited(arch: &str, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(tiny_dir(arch).join(f), dir.path().join(f)).expect("copy");
    }
    let p = dir.path().join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&p).expect("read")).expect("json");
    edit(c.as_object_mut().expect("object"));
    std::fs::write(&p, serde_json::to_vec(&c).expect("json")).expect("write");
    dir
}

fn arch_of(arch: &str, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> ModelArch {
    let dir = edited(arch, edit);
    open_model(dir.path(), None).unwrap_or_else(|e| panic!("{arch}: {e}")).model.arch
}

/// The one-line refusal of `arch` with `edit`, which must name `config.json` and contain every
/// one of `needles`.
fn refusal(arch: &str, edit: impl FnOnce(&mut serde_json::Map<String, Value>), needles: &[&str]) {
    let dir = edited(arch, edit);
    let e = open_model(dir.path(), None).err().expect("refused").to_string();
    assert!(!e.contains('\n'), "{e}");
    assert!(e.starts_with(&dir.path().join("config.json").display().to_string()), "{e}");
    for n in needles {
        assert!(e.contains(n), "{n:?} not in {e}");
    }
}

#[test]
fn unsupported_features_are_refused_by_name() {
    use serde_json::json;
    refusal(
        "qwen3",
        |c| drop(c.insert("kv_lora_rank".into(), json!(512))),
        &["multi-head latent attention (MLA)", "kv_lora_rank"],
    );
    refusal("qwen3", |c| drop(c.insert("q_lora_rank".into(), json!(1536))), &["MLA", "q_lora_rank"]);
    refusal(
        "qwen3",
        |c| {
            drop(c.insert(
                "layer_types".into(),
                json!(["linear_attention", "linear_attention", "linear_attention", "full_attention"]),
            ))
        },
        &["linear_attention layers", "layer_types[0]"],
    );
    refusal(
        "qwen3",
        |c| drop(c.insert("linear_num_value_heads".into(), json!(32))),
        &["linear-attention layers", "linear_num_value_heads"],
    );
    refusal(
        "qwen3",
        |c| drop(c.insert("attention_chunk_size".into(), json!(8192))),
        &["chunked attention", "attention_chunk_size"],
    );
    refusal(
        "qwen3",
        |c| drop(c.insert("no_rope_layers".into(), json!([1, 1, 1, 0]))),
        &["without RoPE", "no_rope_layers"],
    );
    refusal(
        "qwen3_moe",
        |c| drop(c.insert("shared_expert_intermediate_size".into(), json!(64))),
        &["shared experts", "shared_expert_intermediate_size"],
    );
    refusal("gemma3", |c| drop(c.insert("text_config".into(), json!({}))), &["multimodal", "text_config"]);
    refusal(
        "gemma3",
        |c| drop(c.insert("architectures".into(), json!(["Gemma3ForConditionalGeneration"]))),
        &["multimodal", "Gemma3ForConditionalGeneration"],
    );
    refusal(
        "gemma3",
        |c| drop(c.insert("use_bidirectional_attention".into(), json!(true))),
        &["bidirectional attention"],
    );
    refusal(
        "qwen3",
        |c| drop(c.insert("hidden_act".into(), json!("gelu"))),
        &["hidden_act gelu is not supported", "silu"],
    );
    refusal(
        "gemma2",
        |c| drop(c.insert("hidden_activation".into(), json!("relu"))),
        &["hidden_activation relu is not supported"],
    );
    refusal(
        "mixtral",
        |c| drop(c.insert("rope_parameters".into(), json!({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}))),
        &["rope_parameters", "RoPE scaling dynamic"],
    );
    // `rope_scaling` replaces the tiny config's `rope_parameters` (Phi3Config.convert_rope_params_to_dict),
    // with its partial_rotary_factor: the whole head (16 dims, 8 pairs) rotates.
    refusal(
        "phi3",
        |c| {
            drop(c.insert(
                "rope_scaling".into(),
                json!({"type": "su", "short_factor": vec![1.0; 6], "long_factor": vec![1.0; 6]}),
            ))
        },
        &["rope scaling short_factor has 6 values for 16 rotated dimensions; expected 8"],
    );
    refusal(
        "phi3",
        |c| drop(c.insert("rope_parameters".into(), json!({"rope_type": "dynamic", "factor": 2.0}))),
        &["rope_parameters", "RoPE scaling dynamic"],
    );
    refusal(
        "gpt_oss",
        |c| c["rope_parameters"]["partial_rotary_factor"] = json!(0.5),
        &["partial rotary (partial_rotary_factor 0.5) with RoPE scaling type yarn"],
    );
    refusal(
        "gemma3",
        |c| c["rope_parameters"]["sliding_attention"]["rope_type"] = json!("linear"),
        &["rope_parameters.sliding_attention", "RoPE scaling type linear on the sliding-window layers"],
    );
    refusal(
        "gemma2",
        |c| drop(c.insert("sliding_window".into(), Value::Null)),
        &["sliding_attention layers but sliding_window is null"],
    );
    refusal(
        "qwen3",
        |c| {
            drop(c.insert(
                "layer_types".into(),
                json!(["full_attention", "sliding_attention", "full_attention", "full_attention"]),
            ))
        },
        &["sliding_window is null (or use_sliding_window is false)"],
    );
    refusal("qwen3_moe", |c| drop(c.insert("decoder_sparse_step".into(), json!(0))), &["decoder_sparse_step is 0"]);
    refusal(
        "qwen3",
        |c| drop(c.insert("architectures".into(), json!(["Qwen3NextForCausalLM"]))),
        &["unsupported architecture Qwen3NextForCausalLM", "GptOssForCausalLM"],
    );
}

/// The tiny Phi-3 with LongRoPE in `rope_parameters` (5.x form, `partial_rotary_factor` 0.75: 12
/// rotated dimensions, 6 pairs), `max_position_embeddings` 512 and the top-level
/// `original_max_position_embeddings` 64, then `edit`ed.
fn phi3_longrope(edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Result<ModelArch, String> {
    use serde_json::json;
    let dir = edited("phi3", |c| {
        c.insert(
            "rope_parameters".into(),
            json!({"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                "short_factor": SHORT, "long_factor": LONG}),
        );
        c.insert("max_position_embeddings".into(), json!(512));
        c.insert("original_max_position_embeddings".into(), json!(64));
        edit(c);
    });
    open_model(dir.path(), None).map(|m| m.model.arch).map_err(|e| {
        let e = e.to_string();
        assert!(!e.contains('\n') && e.starts_with(&dir.path().join("config.json").display().to_string()), "{e}");
        e
    })
}

const SHORT: [f32; 6] = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5];
const LONG: [f32; 6] = [2.0, 3.0, 5.0, 8.0, 13.0, 21.0];

fn longrope(original: usize, attention_factor: f64) -> Option<RopeScaling> {
    Some(RopeScaling::LongRope {
        short_factor: SHORT.to_vec(),
        long_factor: LONG.to_vec(),
        original_max_position_embeddings: original,
        attention_factor: attention_factor as f32,
    })
}

#[test]
fn phi3_longrope_configs_read_as_transformers_reads_them() {
    use serde_json::json;
    // factor = 512 / 64 = 8; attention factor √(1 + ln 8 / ln 64) = √1.5.
    let default_af = (1.0 + 8f64.ln() / 64f64.ln()).sqrt();
    let a = phi3_longrope(|_| {}).expect("opens");
    assert_eq!((a.rope_scaling.clone(), a.max_seq_len, a.rotary_dim()), (longrope(64, default_af), 512, 12));
    assert_eq!(a.short_rope_limit(), Some(64));
    // Phi-4-mini's form: `rope_scaling` with the older `type`, top-level theta and partial rotary;
    // the older names `su` and (Phi3Config's rename) `yarn` are LongRoPE too.
    for kind in ["longrope", "su", "yarn"] {
        let a = phi3_longrope(|c| {
            c.remove("rope_parameters");
            c.insert("rope_theta".into(), json!(10000.0));
            c.insert("partial_rotary_factor".into(), json!(0.75));
            c.insert("rope_scaling".into(), json!({"type": kind, "short_factor": SHORT, "long_factor": LONG}));
        })
        .expect("opens");
        assert_eq!(a.rope_scaling, longrope(64, default_af), "{kind}");
    }
    // A given factor sets the default attention factor; a given attention factor is kept.
    let a = phi3_longrope(|c| c["rope_parameters"]["factor"] = json!(4.0)).expect("opens");
    assert_eq!(a.rope_scaling, longrope(64, (1.0 + 4f64.ln() / 64f64.ln()).sqrt()));
    let a = phi3_longrope(|c| c["rope_parameters"]["attention_factor"] = json!(1.75)).expect("opens");
    assert_eq!(a.rope_scaling, longrope(64, 1.75));
    // Phi3Config always has `original_max_position_embeddings` (default 4096), which
    // standardize_rope_params writes over the dict's: 512 / 4096 ≤ 1, attention factor 1.
    let a = phi3_longrope(|c| {
        c.remove("original_max_position_embeddings");
        c["rope_parameters"]["original_max_position_embeddings"] = json!(64);
    })
    .expect("opens");
    assert_eq!(a.rope_scaling, longrope(4096, 1.0));
}

#[test]
fn phi3_longrope_faults_are_refused_naming_the_field() {
    use serde_json::json;
    type Edit = Box<dyn FnOnce(&mut serde_json::Map<String, Value>)>;
    let cases: [(&str, Edit); 8] = [
        (
            "rope scaling short_factor has 5 values for 12 rotated dimensions; expected 6",
            Box::new(|c| c["rope_parameters"]["short_factor"] = json!([1.0, 1.0, 1.0, 1.0, 1.0])),
        ),
        (
            "rope scaling long_factor has 8 values for 12 rotated dimensions; expected 6",
            Box::new(|c| c["rope_parameters"]["long_factor"] = json!(vec![1.0; 8])),
        ),
        (
            "rope_parameters: long_factor is \"x\", not a list of numbers",
            Box::new(|c| c["rope_parameters"]["long_factor"] = json!("x")),
        ),
        (
            "rope_parameters: short_factor is missing (LongRoPE needs it)",
            Box::new(|c| drop(c["rope_parameters"].as_object_mut().map(|r| r.remove("short_factor")))),
        ),
        (
            "rope scaling short_factor -1 must be positive",
            Box::new(|c| c["rope_parameters"]["short_factor"][2] = json!(-1.0)),
        ),
        (
            "rope_parameters: original_max_position_embeddings is 0; it must be positive",
            Box::new(|c| drop(c.insert("original_max_position_embeddings".into(), json!(0)))),
        ),
        (
            "rope_parameters: attention_factor 0 (LongRoPE, factor 8, original_max_position_embeddings 64) must be \
             positive and finite",
            Box::new(|c| c["rope_parameters"]["attention_factor"] = json!(0.0)),
        ),
        (
            // A positive f32, but 1 / (1e-44 · θ^(4/12)) is infinite.
            "rope_parameters.short_factor[2] 1e-44 makes pair 2's RoPE inverse frequency inf",
            Box::new(|c| c["rope_parameters"]["short_factor"][2] = json!(1e-44)),
        ),
    ];
    for (needle, edit) in cases {
        let e = phi3_longrope(edit).expect_err(needle);
        assert!(e.contains(needle), "{needle:?} not in {e}");
    }
}

#[test]
fn older_hub_configs_read_as_transformers_folds_them() {
    use serde_json::json;
    // Gemma 3 before rope_parameters: rope_theta (global), rope_local_base_freq, rope_scaling
    // for the global layers only, and the pattern instead of layer_types.
    let a = arch_of("gemma3", |c| {
        for k in ["rope_parameters", "layer_types", "_sliding_window_pattern"] {
            c.remove(k);
        }
        c.insert("rope_theta".into(), json!(1e6));
        c.insert("rope_local_base_freq".into(), json!(1e4));
        c.insert("rope_scaling".into(), json!({"rope_type": "linear", "factor": 8.0}));
        c.insert("sliding_window_pattern".into(), json!(3));
    });
    assert_eq!(a.windows, [Some(16), Some(16), None, Some(16), Some(16), None]);
    assert_eq!(
        (a.rope_theta, a.local_rope_theta, a.rope_scaling.clone()),
        (1e6, Some(1e4), Some(RopeScaling::Linear { factor: 8.0 }))
    );
    assert_eq!(a.layer_rope(0), (1e4, None));
    // Phi-3 with a top-level partial_rotary_factor (Phi-4-mini) and rope_theta.
    let a = arch_of("phi3", |c| {
        c.remove("rope_parameters");
        c.insert("rope_theta".into(), json!(250000.0));
        c.insert("partial_rotary_factor".into(), json!(0.5));
    });
    assert_eq!((a.rope_theta, a.block.rotary_dim), (250000.0, Some(8)));
    // gpt-oss with rope_scaling (YaRN, truncated by default) and mscale/mscale_all_dim.
    let a = arch_of("gpt_oss", |c| {
        c.remove("rope_parameters");
        c.insert("rope_theta".into(), json!(150000.0));
        c.insert(
            "rope_scaling".into(),
            json!({"type": "yarn", "factor": 4.0, "mscale": 2.0, "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 1024}),
        );
    });
    let want = (0.2 * 4f64.ln() + 1.0) / (0.1 * 4f64.ln() + 1.0);
    assert_eq!(
        a.rope_scaling,
        Some(RopeScaling::Yarn {
            factor: 4.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            original_max_position_embeddings: 1024,
            truncate: true,
            attention_factor: want as f32
        })
    );
    // Qwen3-MoE: hub configs say num_experts; mlp_only_layers and decoder_sparse_step make dense layers.
    let m = {
        let dir = edited("qwen3_moe", |c| {
            let n = c.remove("num_local_experts").expect("num_local_experts");
            c.insert("num_experts".into(), n);
            c.insert("norm_topk_prob".into(), json!(false));
            c.insert("mlp_only_layers".into(), json!([0]));
            c.insert("decoder_sparse_step".into(), json!(2));
        });
        // Layers 0 and 2 are dense now, but the files hold their experts: refused by the first.
        open_model(dir.path(), None).err().expect("experts in a dense layer").to_string()
    };
    let want =
        "tensor model.layers.0.mlp.experts.0.down_proj.weight is an expert of layer 0, which config.json makes dense";
    assert!(m.contains(want), "{m}");
    // Qwen3 with use_sliding_window and no layer_types: layers from max_window_layers slide.
    let a = arch_of("qwen3", |c| {
        c.remove("layer_types");
        c.insert("use_sliding_window".into(), json!(true));
        c.insert("sliding_window".into(), json!(8));
        c.insert("max_window_layers".into(), json!(2));
    });
    assert_eq!(a.windows, [None, None, Some(8), Some(8)]);
    // Mixtral slides in every layer when sliding_window is set; router_jitter_noise is training-only.
    let a = arch_of("mixtral", |c| {
        c.insert("sliding_window".into(), json!(32));
        c.insert("router_jitter_noise".into(), json!(0.1));
    });
    assert_eq!(a.windows, [Some(32); 4]);
}

#[test]
fn inspect_counts_every_held_weight_and_the_active_experts() {
    use qdrift_load::inspect::{Fp32, inspect_loaded};
    for arch in ARCHES {
        let m = open(arch);
        let i = inspect_loaded(&m, 16, 1, &[&Fp32]).expect("inspects");
        assert_eq!(i.params.total, m.model.parameter_count() as u64, "{arch}");
        assert_eq!(i.weight_bytes[0].bytes, 4 * i.params.total, "{arch}");
    }
    // Qwen3-MoE: a token runs the router and 2 of the 8 experts (32 wide) per layer.
    let m = open("qwen3_moe");
    let i = inspect_loaded(&m, 16, 1, &[&Fp32]).expect("inspects");
    let attention = 2 * 128 * 64 + 2 * 64 * 64;
    let active = attention + 8 * 64 + 2 * 3 * 64 * 32;
    assert_eq!(i.flops_per_token.matmul, 2 * (4 * active + 512 * 64));
}

/// `transformers`' `FP4_VALUES` (integrations/mxfp4.py).
const FP4: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// Element `(e, r, c)` of an MXFP4 tensor `[E, rows, cols]` as `_convert_moe_packed_tensors`
/// computes it: code `c % 32` of group `c / 32` (even in the low nibble), times 2^(scale − 127).
fn mxfp4_value(blocks: &[u8], scales: &[u8], (rows, cols): (usize, usize), (e, r, c): (usize, usize, usize)) -> f32 {
    let group = (e * rows + r) * (cols / 32) + c / 32;
    let byte = blocks[group * 16 + (c % 32) / 2];
    let code = if c % 2 == 0 { byte & 0x0F } else { byte >> 4 };
    FP4[usize::from(code)] * 2f32.powi(i32::from(scales[group]) - 127)
}

#[test]
fn gpt_oss_mxfp4_experts_are_dequantized() {
    let dir = edited("gpt_oss", |c| {
        c.insert(
            "quantization_config".into(),
            serde_json::json!({"quant_method": "mxfp4", "modules_to_not_convert":
            ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}),
        );
    });
    let bytes = std::fs::read(dir.path().join("model.safetensors")).expect("read");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid");
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .iter()
        .filter(|(n, _)| !n.ends_with("experts.gate_up_proj") && !n.ends_with("experts.down_proj"))
        .map(|(n, v)| (n.to_string(), v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    // gate_up [8, 64 (2I), 64 (dim)] and down [8, 64 (dim), 32 (I)], as [E, out, in].
    let shapes = [("gate_up_proj", 64usize, 64usize), ("down_proj", 64, 32)];
    let codes = |seed: usize, n: usize| -> Vec<u8> { (0..n).map(|i| ((i * 37 + seed * 11) % 256) as u8).collect() };
    let scales = |seed: usize, n: usize| -> Vec<u8> { (0..n).map(|i| (120 + (i + seed) % 12) as u8).collect() };
    for layer in 0..4 {
        for (k, (name, rows, cols)) in shapes.iter().enumerate() {
            let g = cols / 32;
            let p = format!("model.layers.{layer}.mlp.experts.{name}");
            let seed = layer * 2 + k;
            tensors.push((
                format!("{p}_blocks"),
                safetensors::Dtype::U8,
                vec![8, *rows, g, 16],
                codes(seed, 8 * rows * g * 16),
            ));
            tensors.push((
                format!("{p}_scales"),
                safetensors::Dtype::U8,
                vec![8, *rows, g],
                scales(seed, 8 * rows * g),
            ));
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).expect("view")))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).expect("write");
    let m = open_model(dir.path(), None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.quantization.as_ref().map(|q| q.weights.as_str()), Some("mxfp4 (experts)"));
    for layer in 0..4 {
        let e = m.model.layers[layer].experts().expect("experts");
        let (gu_b, gu_s) = (codes(layer * 2, 8 * 64 * 2 * 16), scales(layer * 2, 8 * 64 * 2));
        let (dn_b, dn_s) = (codes(layer * 2 + 1, 8 * 64 * 16), scales(layer * 2 + 1, 8 * 64));
        for (k, x) in e.experts.iter().enumerate() {
            for j in 0..32 {
                for h in 0..64 {
                    assert_eq!(x.gate.data[j * 64 + h], mxfp4_value(&gu_b, &gu_s, (64, 64), (k, 2 * j, h)));
                    assert_eq!(x.up.data[j * 64 + h], mxfp4_value(&gu_b, &gu_s, (64, 64), (k, 2 * j + 1, h)));
                    assert_eq!(x.down.data[h * 32 + j], mxfp4_value(&dn_b, &dn_s, (64, 32), (k, h, j)));
                }
            }
        }
    }
    // MXFP4 elsewhere than gpt-oss's experts is refused by name.
    refusal(
        "qwen3",
        |c| drop(c.insert("quantization_config".into(), serde_json::json!({"quant_method": "mxfp4"}))),
        &["MXFP4 quantization (quantization_config.quant_method = mxfp4)", "GptOssForCausalLM's experts only"],
    );
}

/// A copy of tiny-arch folder `arch` with the linear `modules` (names without `.weight`) stored
/// as FP8 E4M3 codes with a per-tensor `weight_scale_inv` of 0.01 (`quant_method: fp8`); returns
/// the folder and each module's dequantized values, computed here from the codes.
fn fp8_folder(arch: &str, modules: &[String]) -> (tempfile::TempDir, Vec<Vec<f32>>) {
    let dir = edited(arch, |c| {
        c.insert(
            "quantization_config".into(),
            serde_json::json!({"quant_method": "fp8", "fmt": "e4m3",
            "activation_scheme": "dynamic"}),
        );
    });
    let bytes = std::fs::read(dir.path().join("model.safetensors")).expect("read");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid");
    let weights: Vec<String> = modules.iter().map(|m| format!("{m}.weight")).collect();
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .iter()
        .filter(|(n, _)| !weights.iter().any(|w| w == n))
        .map(|(n, v)| (n.to_string(), v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    let scale = 0.01f32;
    let mut values = Vec::new();
    for (k, w) in weights.iter().enumerate() {
        let shape = st.tensor(w).expect("module").shape().to_vec();
        let n: usize = shape.iter().product();
        // Finite E4M3 codes of both signs (0x7F and 0xFF are NaN).
        let codes: Vec<u8> =
            (0..n).map(|i| ((i * 29 + k * 13) % 0x7F) as u8 | if i % 3 == 0 { 0x80 } else { 0 }).collect();
        values.push(codes.iter().map(|&c| qdrift_load::ofp8::Ofp8::E4M3.decode(c) * scale).collect());
        tensors.push((w.clone(), safetensors::Dtype::F8_E4M3, shape, codes));
        let m = w.trim_end_matches(".weight");
        tensors.push((format!("{m}.weight_scale_inv"), safetensors::Dtype::F32, vec![1], scale.to_le_bytes().to_vec()));
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).expect("view")))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).expect("write");
    (dir, values)
}

#[test]
fn quantized_fused_and_expert_modules_are_dequantized_by_name() {
    // Phi-3: the fused modules are dequantized whole, then split (q/k permuted within 12 rows).
    let modules = ["model.layers.1.self_attn.qkv_proj".to_string(), "model.layers.1.mlp.gate_up_proj".to_string()];
    let (dir, values) = fp8_folder("phi3", &modules);
    let m = open_model(dir.path(), None).unwrap_or_else(|e| panic!("{e}"));
    let l = &m.model.layers[1];
    let (qkv, gate_up) = (&values[0], &values[1]);
    assert_permuted(&l.wq, &qkv[..64 * 64], &rotate_half_row_order_partial(4, 16, 12), "wq");
    assert_permuted(&l.wk, &qkv[64 * 64..96 * 64], &rotate_half_row_order_partial(2, 16, 12), "wk");
    assert_eq!(l.wv.data, &qkv[96 * 64..]);
    let mlp = l.mlp().expect("dense");
    assert_eq!((&mlp.gate.data[..], &mlp.up.data[..]), (&gate_up[..128 * 64], &gate_up[128 * 64..]));
    // The source storage counts each fused module once, with all its weights.
    let storage = m.source_storage.as_ref().expect("quantized storage");
    let fp8 = storage.by_type.iter().find(|t| t.dtype.starts_with("fp8")).expect("fp8 entry");
    assert_eq!((fp8.tensors, fp8.elements), (2, 128 * 64 + 256 * 64));
    // Mixtral's and Qwen3-MoE's experts, one module each.
    let modules: Vec<String> =
        ["w1", "w3", "w2"].iter().map(|w| format!("model.layers.2.block_sparse_moe.experts.5.{w}")).collect();
    let (dir, values) = fp8_folder("mixtral", &modules);
    let m = open_model(dir.path(), None).unwrap_or_else(|e| panic!("{e}"));
    let x = &m.model.layers[2].experts().expect("experts").experts[5];
    assert_eq!([&x.gate.data, &x.up.data, &x.down.data], [&values[0], &values[1], &values[2]]);
    let modules = vec!["model.layers.0.mlp.experts.7.down_proj".to_string()];
    let (dir, values) = fp8_folder("qwen3_moe", &modules);
    let m = open_model(dir.path(), None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.model.layers[0].experts().expect("experts").experts[7].down.data, values[0]);
}

#[test]
fn layer_counts_and_bias_flags_follow_the_class() {
    use serde_json::json;
    // An absurd layer count is refused before anything per layer is allocated, by the class's
    // minimum of tensors per layer.
    for (arch, per_layer) in [("qwen3", 11), ("gemma3", 13), ("phi3", 6), ("gpt_oss", 13)] {
        refusal(
            arch,
            |c| drop(c.insert("num_hidden_layers".into(), json!(1u64 << 40))),
            &[&format!("num_hidden_layers {} needs at least {per_layer} tensors per layer", 1u64 << 40)],
        );
    }
    // gpt-oss without attention_bias reads no attention biases (transformers ignores the stored ones).
    let dir = edited("gpt_oss", |c| drop(c.insert("attention_bias".into(), json!(false))));
    let m = open_model(dir.path(), None).unwrap_or_else(|e| panic!("{e}"));
    assert!(m.model.layers.iter().all(|l| l.bq.is_none() && l.bk.is_none() && l.bv.is_none() && l.bo.is_none()));
    // Qwen3 with attention_bias needs all four biases.
    let dir = edited("qwen3", |c| drop(c.insert("attention_bias".into(), json!(true))));
    let e = open_model(dir.path(), None).err().expect("refused").to_string();
    assert!(e.contains("tensor model.layers.0.self_attn.q_proj.bias is missing; expected shape [128]"), "{e}");
}

/// The tiny Phi-3 is tied (`tie_word_embeddings: true`, no `lm_head` in its files). Untied, or
/// with the key absent (Phi3Config's default is false), its missing `lm_head.weight` is refused
/// naming the tensor and the key, rather than run with the embedding as the output layer.
#[test]
fn an_untied_head_without_lm_head_is_refused() {
    use serde_json::json;
    let missing = "but the weights files have no lm_head.weight";
    refusal(
        "phi3",
        |c| drop(c.insert("tie_word_embeddings".into(), json!(false))),
        &["config.json: tie_word_embeddings is false", missing],
    );
    refusal(
        "phi3",
        |c| drop(c.remove("tie_word_embeddings")),
        &["tie_word_embeddings is absent, which Phi3ForCausalLM reads as false,", missing],
    );
}

/// A ninth expert where config.json says eight: the reader reads experts 0..8 by name and left
/// the ninth out; it is refused naming the tensor and the key.
#[test]
fn an_expert_past_the_configs_count_is_refused() {
    let dir = edited("qwen3_moe", |_| {});
    let st = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&st).expect("weights");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("valid");
    let extra = "model.layers.0.mlp.experts.8.gate_proj.weight";
    let zeros = vec![0u8; 32 * 64 * 2];
    let mut views: Vec<(String, safetensors::tensor::TensorView<'_>)> =
        file.iter().map(|(n, v)| (n.to_string(), v)).collect();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![32, 64], &zeros).expect("view");
    views.push((extra.to_string(), view));
    safetensors::serialize_to_file(views, None, &st).expect("written");
    let e = open_model(dir.path(), None).err().expect("refused").to_string();
    let want = format!("{}: tensor {extra} is expert 8, but config.json's num_local_experts is 8", st.display());
    assert!(e.starts_with(&want), "{e}");
}

/// The tiny Qwen3's `tokenizer.json` with its 252 merges listed twice: the `tokenizers` crate
/// read it (the copy's rank replacing the first's); it is refused naming the first repeat, both where
/// a folder is opened and where it is converted for a GGUF file.
#[test]
fn repeated_merges_are_refused_naming_the_first() {
    let dir = edited("qwen3", |_| {});
    let tok = dir.path().join("tokenizer.json");
    let mut t: Value = serde_json::from_slice(&std::fs::read(&tok).expect("read")).expect("json");
    let merges = t["model"]["merges"].as_array().expect("merges").clone();
    assert_eq!(merges.len(), 252);
    t["model"]["merges"] = Value::Array([merges.clone(), merges].concat());
    std::fs::write(&tok, serde_json::to_vec(&t).expect("json")).expect("write");
    let want = format!(
        "{}: model.merges[252] (Ġ t) repeats model.merges[0]: a BPE tokenizer merges each pair once",
        tok.display()
    );
    assert_eq!(open_model(dir.path(), None).err().expect("refused").to_string(), want);
    let e = qdrift_load::write::hf_tokenizer_keys(dir.path(), &tok, 512).expect_err("refused").to_string();
    assert_eq!(e, want);
}

/// A multimodal wrapper (`Gemma3ForConditionalGeneration`, `Llama4ForConditionalGeneration`: the
/// text model's config as
/// `text_config`, its weights under `model.language_model.`, a vision tower and projector beside
/// them) reads as its language model, with a note saying so; the same weights wrapped the older
/// way (`language_model.model.`, `language_model.lm_head.`) too.
#[test]
fn a_multimodal_wrapper_reads_as_its_language_model() {
    use serde_json::json;
    let wrappers = [
        ("gemma3", "Gemma3ForConditionalGeneration", "gemma3", "Gemma3ForCausalLM"),
        ("llama4", "Llama4ForConditionalGeneration", "llama4", "Llama4ForCausalLM"),
    ];
    let prefixes = [("model.language_model.", "lm_head."), ("language_model.model.", "language_model.lm_head.")];
    for ((folder, wrapper, model_type, class), (prefix, head)) in
        wrappers.into_iter().flat_map(|w| prefixes.map(|p| (w, p)))
    {
        let plain = open(folder);
        assert!(plain.notes.is_empty(), "{:?}", plain.notes);
        let dir = edited(folder, |c| {
            let text = Value::Object(std::mem::take(c));
            c.insert("architectures".into(), json!([wrapper]));
            c.insert("model_type".into(), json!(model_type));
            c.insert("text_config".into(), text);
            c.insert("vision_config".into(), json!({"model_type": "siglip_vision_model", "hidden_size": 4}));
        });
        let bytes = std::fs::read(tiny_dir(folder).join("model.safetensors")).expect("model.safetensors");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid");
        let mut tensors: Vec<(String, safetensors::tensor::TensorView<'_>)> = st
            .tensors()
            .into_iter()
            .map(|(name, t)| {
                let renamed = match (name.strip_prefix("model."), name.strip_prefix("lm_head.")) {
                    (Some(rest), _) => format!("{prefix}{rest}"),
                    (_, Some(rest)) => format!("{head}{rest}"),
                    _ => name,
                };
                (renamed, t)
            })
            .collect();
        let tower = vec![0u8; 2 * 4 * 4];
        for name in [
            "model.vision_tower.vision_model.embeddings.patch_embedding.weight",
            "model.multi_modal_projector.mm_input_projection_weight",
        ] {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![4, 4], &tower).expect("view");
            tensors.push((name.to_string(), view));
        }
        let out = safetensors::serialize(tensors, None).expect("serialize");
        std::fs::write(dir.path().join("model.safetensors"), out).expect("write");
        let wrapped = open_model(dir.path(), None).unwrap_or_else(|e| panic!("{prefix}: {e}"));
        assert_eq!(wrapped.model, plain.model, "{prefix}");
        assert_eq!(wrapped.notes.len(), 1, "{:?}", wrapped.notes);
        let note = &wrapped.notes[0];
        assert!(!note.contains('\n'), "{note}");
        for needle in [wrapper, class, "2 vision/audio tensors"] {
            assert!(note.contains(needle), "{needle:?} not in {note}");
        }
    }
}
