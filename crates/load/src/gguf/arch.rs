//! The llama.cpp architectures beyond `llama` and `qwen2`: `qwen3`, `qwen3moe`, `qwen2moe`,
//! `gemma2`, `gemma3`, `phi3`, `gpt-oss`, `smollm3`, `glm4moe`, and `llama` with experts (Mixtral), read as llama.cpp's
//! loader reads them (`src/llama-model.cpp` `llama_model_base::load_hparams`, `create_tensor_qkv`,
//! `load_swa_pattern`; `src/models/{qwen3,qwen3moe,qwen2moe,gemma2,gemma3,phi3,openai-moe,llama}.cpp`
//! `load_arch_hparams`/`load_arch_tensors`/the graph) and as llama.cpp's
//! `convert_hf_to_gguf.py` writes them (`conversion/{qwen,gemma,phi,gpt_oss,llama}.py`).
//!
//! | feature | keys and tensors | [`HostModel`](qdrift_weights::HostModel) |
//! |---|---|---|
//! | head width | `attention.key_length` = `attention.value_length` (gpt-oss: `rope.dimension_count`) | `head_dim` |
//! | partial rotary (phi3) | `rope.dimension_count` < head width | `block.rotary_dim` |
//! | q/k rows | stored rotate-half (llama.cpp `LLAMA_ROPE_TYPE_NEOX`); `llama` interleaved | interleaved, rotated dims only |
//! | q/k norms (qwen3, qwen3moe, gemma3) | `blk.N.attn_q_norm`, `blk.N.attn_k_norm` `[head_dim]` | `q_norm`, `k_norm` |
//! | Gemma's four norms | `attn_norm`, `post_attention_norm`, `ffn_norm`, `post_ffw_norm`, stored as `1 + w` | [`NormStyle::Weight`] |
//! | gpt-oss's pre-FFN norm | `post_attention_norm` (no `ffn_norm`) | `ffn_norm` |
//! | sliding windows | `attention.sliding_window`, `attention.sliding_window_pattern` (count or per-layer bools; gemma2 and gpt-oss: 2, gemma3: 6) | `windows` |
//! | local RoPE base | `rope.freq_base_swa` (gemma3: 10000 by default) | `local_rope_theta` |
//! | soft caps (gemma2; gemma3 final only) | `attn_logit_softcapping` (50), `final_logit_softcapping` (30) | `block.attn_softcap`, `final_logit_softcap` |
//! | Gemma embedding scale | implied by the architecture: `sqrtf(n_embd)` | `embedding_scale` |
//! | Gemma attention scale | `1/√head_dim` (`1/√(n_embd/n_head)` for the 27B shapes, 46 or 62 layers) | `block.attn_scale` |
//! | fused q/k/v (phi3) | `blk.N.attn_qkv` (q‖k‖v rows), any architecture | `wq`, `wk`, `wv` |
//! | fused gate/up (phi3) | `blk.N.ffn_up` `[2·n_ff, n_embd]`, gate rows first (`ggml_swiglu`) | `Mlp::gate`, `Mlp::up` |
//! | experts | `expert_count`, `expert_used_count`, `expert_feed_forward_length`; `ffn_gate_inp` (+ `.bias`, gpt-oss), `ffn_{gate,up,down}_exps` `[E, rows, cols]` (+ `.bias`, gpt-oss) | [`Experts`] |
//! | routing | qwen3moe and `llama`: softmax, top-k, renormalised (`build_moe_ffn(.., norm_w = true, SOFTMAX)`); qwen2moe: not renormalised (`norm_w = false`); gpt-oss: top-k then softmax (`SOFTMAX_WEIGHT`) | [`Routing`] |
//! | shared expert (qwen2moe) | `expert_shared_feed_forward_length` (default `feed_forward_length`); `ffn_{gate,up,down}_shexp`, the sigmoid gate `ffn_gate_inp_shexp` `[n_embd]` | [`SharedExpert`] |
//! | glm4moe's router | `expert_gating_func` (2, sigmoid), `expert_group_count`, `expert_group_used_count`, `expert_weights_norm`, `expert_weights_scale`, `leading_dense_block_count`; `blk.N.exp_probs_b.bias` `[E]`; ungated shared experts `ffn_{gate,up,down}_shexp` (`expert_shared_count` experts wide); pre-FFN norm `post_attention_norm`; MTP blocks past `block_count - nextn_predict_layers` skipped | [`Routing::GroupedSigmoid`], `router_bias`, `dense_layers` |
//! | attention sinks (gpt-oss) | `blk.N.attn_sinks.weight` `[n_head]` | `sinks` |
//! | LongRoPE (phi3) | `rope_factors_short.weight`, `rope_factors_long.weight` `[rotary_dim/2]`, `rope.scaling.original_context_length`, `rope.scaling.attn_factor` | [`RopeScaling::LongRope`] |
//! | YaRN (gpt-oss) | `rope.scaling.type = yarn`, `rope.scaling.factor`, `rope.scaling.original_context_length`, `rope.scaling.attn_factor`; β 32/1 as llama.cpp (it reads no β keys), correction dims floored/ceiled (`ggml_rope_yarn_corr_dims`) | [`RopeScaling::Yarn`] |
//!
//! Anything else a file asks for is refused by name: partial rotary outside phi3 and glm4moe, LongRoPE
//! factors outside phi3, shared experts outside qwen2moe and glm4moe, different key and value widths, any tensor the
//! architecture's llama.cpp loader does not use.

use super::read::{
    ArchKeys, BlockReader, GgufTokenizerMetadata, GgufValue, ModelPlan, TensorTable, read_hyper_parameters,
    read_rope_scaling,
};
use crate::LoadError;
use crate::arch::{self, Arch, DenseRule, GgufWidth, SoftCaps, Tied};
use crate::rope_layout::{RopeLayout, permute_head_rows};
use qdrift_weights::{
    Experts, Ffn, HostTensor, LayerWeights, Mlp, ModelArch, MoeSpec, NormStyle, RopeScaling, Routing, SharedExpert,
};

/// The attention scale llama.cpp uses (`f_attention_scale` for Gemma, `1/√n_rot` for gpt-oss,
/// `1/√head_dim` otherwise); for the shapes of [`GgufRules::wide_scale_layers`](crate::arch::GgufRules)
/// (Gemma's 27B) `1/√(n_embd/n_head)` with integer division, as `gemma2.cpp`/`gemma3.cpp`.
pub(crate) fn attn_scale(entry: Arch, n_layers: usize, dim: usize, n_heads: usize, head_dim: usize) -> f32 {
    let wide = entry.gguf.wide_scale_layers == Some(n_layers);
    let width = if wide { dim / n_heads.max(1) } else { head_dim };
    1.0 / (width as f32).sqrt()
}

/// `llama_hparams::set_swa_pattern(n, dense_first = false)`: layer `il` is a sliding-window
/// layer when `n == 0 || il % n < n - 1`.
pub(crate) fn swa_by_pattern(n: usize, il: usize) -> bool {
    n == 0 || il % n < n - 1
}

/// The architecture and block reader, when the file's architecture is a family of
/// [`arch::ARCHITECTURES`] beyond the dense `llama` and `qwen2` ([`super::read::FamilyReader`]).
pub(super) fn read_family_of(
    table: &TensorTable<'_>,
    keys: &ArchKeys<'_>,
    tokenizer: &GgufTokenizerMetadata,
) -> Result<Option<ModelPlan>, LoadError> {
    let Some(family) = arch::by_gguf_name(keys.arch, || Ok::<_, LoadError>(keys.int("expert_count", Some(0))? > 0))?
    else {
        return Ok(None);
    };
    let arch = read_family_arch(keys, table, tokenizer, family)?;
    let n_layers = arch.n_layers;
    let blocks = Box::new(FamilyBlocks { family, arch_name: keys.arch.to_string(), n_layers });
    Ok(Some(ModelPlan { arch, blocks, skipped_blocks: nextn_layers(keys, family, usize::MAX)? }))
}

/// A family file's blocks ([`read_family_layer`]); a tensor no part read is refused, naming
/// the feature it stands for.
struct FamilyBlocks {
    family: Arch,
    /// `general.architecture`, for the refusal.
    arch_name: String,
    /// The model's blocks; those past them are glm4moe's MTP layers ([`nextn_layers`]).
    n_layers: usize,
}

impl BlockReader for FamilyBlocks {
    fn layer(&self, table: &TensorTable<'_>, arch: &ModelArch, i: usize) -> Result<LayerWeights, LoadError> {
        read_family_layer(table, arch, self.family, i)
    }

    fn unused(&self, name: &str) -> Option<String> {
        // The MTP layers (`nextn_predict_layers`) llama.cpp loads but does not run.
        let mtp = crate::names::indexed(name, "blk.").is_some_and(|(layer, _)| layer >= self.n_layers);
        if self.family.gguf.nextn && mtp {
            return None;
        }
        Some(format!("tensor {name}: {} is not supported for {}", unused_feature(name), self.arch_name))
    }
}

/// The feature a tensor the reader does not use stands for, for the refusal.
fn unused_feature(name: &str) -> &'static str {
    if name.contains("_shexp") {
        "a shared expert"
    } else if name.starts_with("rope_factors") || name.contains("rope_factors") {
        "LongRoPE (rope_factors_long/rope_factors_short)"
    } else if name.contains("rope_freqs") {
        "per-pair RoPE frequency factors (rope_freqs.weight)"
    } else if name.ends_with(".bias") {
        "this bias"
    } else if name.contains("_norm") {
        "this norm"
    } else {
        "this tensor"
    }
}

/// [`ModelArch`] of a family file.
fn read_family_arch(
    keys: &ArchKeys<'_>,
    table: &TensorTable<'_>,
    tokenizer: &GgufTokenizerMetadata,
    family: Arch,
) -> Result<ModelArch, LoadError> {
    let path = keys.path;
    let refuse = |m: String| LoadError::invalid(path, m);
    if let Some(feature) = family.gguf.not_read {
        return Err(refuse(format!("GGUF {}: {feature} are not read yet", family.gguf.name)));
    }
    let mut arch = read_hyper_parameters(keys, table, tokenizer)?;
    arch.architecture = family.gguf.name.to_string();
    arch.n_layers -= nextn_layers(keys, family, arch.n_layers)?;
    arch.layer_attention.rope = family.gguf.rope_layers(arch.n_layers);
    let key_length = keys.int("attention.key_length", Some(arch.dim / arch.n_heads))?;
    let n_rot = keys.int("rope.dimension_count", Some(key_length))?;
    // gpt-oss's tensors and graph use n_rot as the head width (`openai-moe.cpp`).
    let head_dim = if family.block.sinks { n_rot } else { key_length };
    let value_length = keys.int("attention.value_length", Some(head_dim))?;
    if value_length != head_dim || key_length != head_dim {
        return Err(refuse(format!(
            "{} is {key_length} and {} is {value_length} but the head width is {head_dim}: different key and \
             value head widths are not supported",
            keys.key("attention.key_length"),
            keys.key("attention.value_length")
        )));
    }
    arch.head_dim = head_dim;
    if n_rot != head_dim {
        if !family.block.partial_rotary && family.block.partial_factor.is_none() {
            return Err(refuse(format!(
                "{} is {n_rot} but the head dimension is {head_dim}: partial rotary embeddings are not \
                 supported for {}",
                keys.key("rope.dimension_count"),
                keys.arch
            )));
        }
        arch.block.rotary_dim = Some(n_rot);
    }
    if family.block.fused && head_dim * arch.n_heads != arch.dim {
        return Err(refuse(format!(
            "{} is {head_dim} but phi3's q projection is embedding_length {} wide: a head width other than \
             embedding_length / head_count is not supported for phi3",
            keys.key("attention.key_length"),
            arch.dim
        )));
    }
    let features = &family.block;
    // glm4moe's q/k norms are optional (`use_qk_norm`; `glm4-moe.cpp` applies them if loaded).
    arch.block.qk_norm =
        features.qk_norm || (features.qk_norm_key.is_some() && table.find("blk.0.attn_q_norm.weight").is_some());
    arch.block.activation = features.activation.gguf();
    arch.block.sinks = features.sinks;
    arch.block.norm = NormStyle::Weight;
    if features.gemma_norms {
        arch.block.sandwich_norms = true;
        arch.embedding_scale = Some((arch.dim as f32).sqrt());
        // Always stated, as the Hugging Face reader states `query_pre_attn_scalar^-½`.
        arch.block.attn_scale = Some(attn_scale(family, arch.n_layers, arch.dim, arch.n_heads, head_dim));
    }
    match features.softcaps {
        SoftCaps::AttnAndFinal => {
            arch.block.attn_softcap = Some(keys.float("attn_logit_softcapping", Some(50.0))?);
            arch.final_logit_softcap = Some(keys.float("final_logit_softcapping", Some(30.0))?);
        }
        SoftCaps::Final => {
            let cap = keys.float("final_logit_softcapping", Some(0.0))?;
            arch.final_logit_softcap = (cap != 0.0).then_some(cap);
        }
        SoftCaps::None => {}
    }
    // gemma2's output is always the embedding; gpt-oss requires `output.weight`.
    arch.tied_embeddings = match family.gguf.tied {
        Tied::Always => true,
        Tied::Never => false,
        Tied::IfNoOutput => table.find("output.weight").is_none(),
    };
    arch.windows = read_windows(keys, family, arch.n_layers)?;
    arch.moe = read_moe(keys, family, arch.hidden_dim, arch.n_layers)?;
    if family.gguf.llama {
        // As the dense `llama` reader: the linear factor and `rope_freqs.weight`.
        arch.rope_scaling = read_rope_scaling(keys, table, arch.head_dim)?;
    } else {
        let (scaling, local) = read_family_rope(keys, family, &arch)?;
        arch.rope_scaling = scaling;
        arch.local_rope_theta = local;
        if features.partial_rotary
            && let Some(longrope) = read_phi3_longrope(keys, table, &arch)?
        {
            arch.rope_scaling = Some(longrope);
        }
    }
    arch.validate().map_err(|e| refuse(format!("inconsistent {} hyper-parameters: {e}", keys.arch)))?;
    Ok(arch)
}

/// The MTP blocks past the model's: glm4moe's `nextn_predict_layers` (default 0, as
/// `llama_model_glm4_moe`), which `glm4-moe.cpp` loads but leaves out of its graph
/// (`n_layer - nextn_predict_layers` blocks run); 0 for the other families. At least one block
/// must remain.
fn nextn_layers(keys: &ArchKeys<'_>, family: Arch, block_count: usize) -> Result<usize, LoadError> {
    if !family.gguf.nextn {
        return Ok(0);
    }
    let n = keys.int("nextn_predict_layers", Some(0))?;
    if n >= block_count {
        return Err(LoadError::invalid(
            keys.path,
            format!(
                "{} is {n} but {} is {block_count}: no block is left to run",
                keys.key("nextn_predict_layers"),
                keys.key("block_count")
            ),
        ));
    }
    Ok(n)
}

/// phi3's LongRoPE as llama.cpp stores it (`conversion/phi.py` `Phi3MiniModel`:
/// `generate_extra_tensors`, `set_gguf_parameters`; `src/models/phi3.cpp`,
/// `llama_model::get_rope_factors`): the tensors `rope_factors_short.weight` and
/// `rope_factors_long.weight` (`[rotary_dim / 2]` f32 divisors each), the original context
/// `rope.scaling.original_context_length` (default `context_length`) and
/// `rope.scaling.attn_factor` (default 1), which `llama_context` multiplies cos and sin by.
/// llama.cpp runs the short factors while its context is at most the original one, as qdrift
/// does ([`RopeScaling::LongRope`]). `None` without the tensors; one without the other, or with
/// another RoPE scaling, is refused.
fn read_phi3_longrope(
    keys: &ArchKeys<'_>,
    table: &TensorTable<'_>,
    arch: &ModelArch,
) -> Result<Option<RopeScaling>, LoadError> {
    let pairs = [arch.rotary_dim() / 2];
    let short = table.optional("rope_factors_short.weight", &pairs)?;
    let long = table.optional("rope_factors_long.weight", &pairs)?;
    let (short, long) = match (short, long) {
        (None, None) => return Ok(None),
        (Some(s), Some(l)) => (s.data, l.data),
        (s, _) => {
            let missing = if s.is_none() { "rope_factors_short.weight" } else { "rope_factors_long.weight" };
            return Err(LoadError::invalid(
                keys.path,
                format!("tensor {missing} is missing: LongRoPE needs both rope_factors_short and rope_factors_long"),
            ));
        }
    };
    if let Some(other) = &arch.rope_scaling {
        return Err(LoadError::invalid(
            keys.path,
            format!(
                "LongRoPE factors (rope_factors_short/long) with another RoPE scaling ({other:?}) are not supported"
            ),
        ));
    }
    let scaling = RopeScaling::LongRope {
        short_factor: short,
        long_factor: long,
        original_max_position_embeddings: keys.int("rope.scaling.original_context_length", Some(arch.max_seq_len))?,
        attention_factor: keys.float("rope.scaling.attn_factor", Some(1.0))?,
    };
    scaling
        .validate(arch.rotary_dim())
        .map_err(|e| LoadError::invalid(keys.path, format!("phi3 LongRoPE (rope_factors_short/long): {e}")))?;
    Ok(Some(scaling))
}

/// Each layer's sliding window, as `load_arch_hparams` and `load_swa_pattern` set them; empty
/// when every layer attends fully (and for the families whose llama.cpp graph has no sliding
/// window: qwen3, qwen3moe, phi3 (`Phi SWA is currently disabled`), `llama`).
fn read_windows(keys: &ArchKeys<'_>, family: Arch, n_layers: usize) -> Result<Vec<Option<usize>>, LoadError> {
    let Some(default_pattern) = family.gguf.swa_pattern else {
        return Ok(Vec::new());
    };
    let n_swa = keys.int("attention.sliding_window", family.gguf.sliding_window)?;
    if n_swa == 0 {
        if family.gguf.sliding_window == Some(0) {
            return Ok(Vec::new());
        }
        return Err(LoadError::invalid(
            keys.path,
            format!("{} is 0: a sliding window of no tokens is not supported", keys.key("attention.sliding_window")),
        ));
    }
    let pattern_key = keys.key("attention.sliding_window_pattern");
    let is_swa: Vec<bool> = match keys.meta.get(&pattern_key) {
        None => (0..n_layers).map(|il| swa_by_pattern(default_pattern, il)).collect(),
        Some(GgufValue::Array(items)) => {
            let flags: Option<Vec<bool>> =
                items.iter().map(|v| v.as_bool().or_else(|| v.as_u64().map(|x| x != 0))).collect();
            let flags = flags.ok_or_else(|| {
                LoadError::invalid(keys.path, format!("{pattern_key} is not an array of booleans or integers"))
            })?;
            // llama.cpp copies the entries it has; the layers past them stay full.
            (0..n_layers).map(|il| flags.get(il).copied().unwrap_or(false)).collect()
        }
        Some(v) => {
            let n = v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| LoadError::invalid(keys.path, format!("{pattern_key} is {v:?}, not a count")))?;
            (0..n_layers).map(|il| swa_by_pattern(n, il)).collect()
        }
    };
    if !is_swa.contains(&true) {
        return Ok(Vec::new());
    }
    Ok(is_swa.into_iter().map(|s| s.then_some(n_swa)).collect())
}

/// The mixture of experts of the families that have one (every layer; llama.cpp's qwen3moe and
/// qwen2moe have no dense layers; glm4moe's first `leading_dense_block_count`), with qwen2moe's
/// shared expert (`expert_shared_feed_forward_length`, `n_ff` by default as `qwen2moe.cpp`) or
/// glm4moe's ungated ones (`expert_shared_count` experts wide); any other file declaring experts
/// or shared experts is refused.
fn read_moe(
    keys: &ArchKeys<'_>,
    family: Arch,
    hidden_dim: usize,
    n_layers: usize,
) -> Result<Option<MoeSpec>, LoadError> {
    let n_experts = keys.int("expert_count", Some(0))?;
    let shared = keys.int("expert_shared_count", Some(0))?;
    let rules = family.moe.as_ref();
    if shared > 0 && rules.is_none_or(|m| m.shared_expert.is_none() && m.ungated_shared.is_none()) {
        return Err(LoadError::invalid(
            keys.path,
            format!("{} is {shared}: shared experts are not supported", keys.key("expert_shared_count")),
        ));
    }
    let Some(rules) = rules else {
        if n_experts > 0 {
            return Err(LoadError::invalid(
                keys.path,
                format!(
                    "{} is {n_experts}: a mixture of experts is not supported for {}",
                    keys.key("expert_count"),
                    keys.arch
                ),
            ));
        }
        return Ok(None);
    };
    if n_experts == 0 {
        return Err(LoadError::invalid(keys.path, format!("{} is missing or 0", keys.key("expert_count"))));
    }
    let top_k = keys.int("expert_used_count", None)?;
    let expert_hidden = match rules.gguf_width {
        // `qwen3moe.cpp`, `qwen2moe.cpp`: `n_ff_exp ? n_ff_exp : n_ff / n_expert_used`.
        GgufWidth::KeyOrPerExpert => keys.int("expert_feed_forward_length", Some(hidden_dim / top_k.max(1)))?,
        GgufWidth::Key => keys.int("expert_feed_forward_length", None)?,
        GgufWidth::FeedForward => hidden_dim,
    };
    let shared_expert_hidden = match (rules.shared_expert, rules.ungated_shared) {
        (Some(_), _) => Some(keys.int("expert_shared_feed_forward_length", Some(hidden_dim))?),
        // `glm4moe`: `n_ff_shexp = n_ff_exp * n_expert_shared`.
        (None, Some(_)) if shared > 0 => Some(expert_hidden * shared),
        _ => None,
    };
    let routing = match rules.gguf_routing {
        Routing::GroupedSigmoid { .. } => read_grouped_routing(keys, n_experts, top_k)?,
        other => other,
    };
    let dense_layers = match rules.dense_layers {
        DenseRule::FirstK(_) => {
            let lead = keys.int("leading_dense_block_count", Some(0))?;
            if lead >= n_layers {
                return Err(LoadError::invalid(
                    keys.path,
                    format!(
                        "{} is {lead} but the model has {n_layers} blocks: no block has experts",
                        keys.key("leading_dense_block_count")
                    ),
                ));
            }
            (0..lead).collect()
        }
        _ => Vec::new(),
    };
    Ok(Some(MoeSpec { n_experts, top_k, expert_hidden, routing, dense_layers, shared_expert_hidden }))
}

/// glm4moe's routing, as `llm_graph_context::build_moe_ffn` runs it: `expert_gating_func`
/// sigmoid (2; absent or 0 is sigmoid, as `llama_model_glm4_moe`), the `exp_probs_b` bias for
/// the choice only, groups when `expert_group_count` > 1 (the `expert_group_used_count` groups
/// with the largest sums of their two best biased scores, as `modeling_deepseek.py`), the chosen
/// weights divided by their sum iff `expert_weights_norm` (default false) and times
/// `expert_weights_scale` (required): [`Routing::GroupedSigmoid`]. Groups that do not divide the
/// experts, or that cannot hold the top-k, are refused by their keys.
fn read_grouped_routing(keys: &ArchKeys<'_>, n_experts: usize, top_k: usize) -> Result<Routing, LoadError> {
    let bad = |key: &str, m: String| LoadError::invalid(keys.path, format!("{} {m}", keys.key(key)));
    match keys.int("expert_gating_func", Some(0))? {
        0 | 2 => {}
        g => return Err(bad("expert_gating_func", format!("is {g}: only sigmoid gating (2) is supported"))),
    }
    let groups = keys.int("expert_group_count", Some(0))?.max(1);
    let used = if groups > 1 { keys.int("expert_group_used_count", Some(0))? } else { 1 };
    let per_group = n_experts / groups;
    if !n_experts.is_multiple_of(groups) || per_group < 2 {
        return Err(bad(
            "expert_group_count",
            format!("is {groups}: the groups must split the {n_experts} experts evenly, at least 2 to a group"),
        ));
    }
    if used == 0 || used > groups || top_k > used * per_group {
        return Err(bad(
            "expert_group_used_count",
            format!(
                "is {used}: from 1 to the {groups} groups, whose experts must hold the {top_k} chosen \
                 (expert_used_count)"
            ),
        ));
    }
    let renormalize = match keys.meta.get(&keys.key("expert_weights_norm")) {
        None => false,
        Some(v) => v.as_bool().ok_or_else(|| bad("expert_weights_norm", format!("is {v:?}, not a boolean")))?,
    };
    let scale = keys.float("expert_weights_scale", None)?;
    Ok(Routing::GroupedSigmoid { n_group: groups, topk_group: used, renormalize, scale })
}

/// RoPE scaling and the sliding-window layers' base, as llama.cpp applies them: `none`,
/// `linear` ([`RopeScaling::Linear`]) or `yarn` (gpt-oss's; [`RopeScaling::Yarn`] with β 32/1
/// and truncated correction dims, and attention factor `(1 + 0.1·ln factor)·rope.scaling.attn_factor`,
/// `llama_context`'s `yarn_attn_factor` times `rope_yarn`'s mscale); gemma3's sliding layers use
/// `rope.freq_base_swa` (10000 by default) unscaled; gemma2's and gpt-oss's use it when given,
/// scaled like the others (refused with scaling: [`ModelArch`] leaves those layers unscaled).
fn read_family_rope(
    keys: &ArchKeys<'_>,
    family: Arch,
    arch: &ModelArch,
) -> Result<(Option<RopeScaling>, Option<f32>), LoadError> {
    let path = keys.path;
    let type_key = keys.key("rope.scaling.type");
    let kind = match keys.meta.get(&type_key) {
        None => "linear",
        Some(GgufValue::String(s)) => s.as_str(),
        Some(other) => return Err(LoadError::invalid(path, format!("{type_key} is {other:?}, not a string"))),
    };
    let factor = match keys.meta.get(&keys.key("rope.scaling.factor")) {
        Some(_) => keys.float("rope.scaling.factor", None)?,
        None => keys.float("rope.scale_linear", Some(0.0))?,
    };
    let scaling = match kind {
        "none" => None,
        "linear" if factor == 0.0 || factor == 1.0 => None,
        "linear" => Some(RopeScaling::Linear { factor }),
        "yarn" => {
            let log_mul = keys.float("rope.scaling.yarn_log_mul", Some(0.0))?;
            if log_mul != 0.0 {
                return Err(LoadError::invalid(
                    path,
                    format!(
                        "{} is {log_mul}: YaRN's mscale_all_dim is not supported",
                        keys.key("rope.scaling.yarn_log_mul")
                    ),
                ));
            }
            let factor = if factor == 0.0 { 1.0 } else { factor };
            let mscale = if factor <= 1.0 { 1.0 } else { 1.0 + 0.1 * factor.ln() };
            Some(RopeScaling::Yarn {
                factor,
                beta_fast: 32.0,
                beta_slow: 1.0,
                original_max_position_embeddings: keys
                    .int("rope.scaling.original_context_length", Some(arch.max_seq_len))?,
                truncate: true,
                attention_factor: mscale * keys.float("rope.scaling.attn_factor", Some(1.0))?,
            })
        }
        // phi3's factors are tensors ([`read_phi3_longrope`]); llama.cpp's converter writes no type.
        "longrope" if family.block.partial_rotary => None,
        "longrope" => {
            return Err(LoadError::invalid(
                path,
                format!("{type_key} = longrope: LongRoPE (rope_factors_long/rope_factors_short) is not supported"),
            ));
        }
        other => {
            return Err(LoadError::invalid(
                path,
                format!("{type_key} = {other} is not supported; supported: none, linear, yarn"),
            ));
        }
    };
    let swa_base_key = keys.key("rope.freq_base_swa");
    let local = if arch.windows.is_empty() {
        None
    } else if let Some(local) = family.block.local_rope_theta {
        Some(keys.float("rope.freq_base_swa", Some(local))?)
    } else if keys.meta.contains_key(&swa_base_key) {
        let base = keys.float("rope.freq_base_swa", None)?;
        if base == arch.rope_theta {
            None
        } else if scaling.is_some() {
            return Err(LoadError::invalid(
                path,
                format!(
                    "{swa_base_key} with RoPE scaling: a sliding-window RoPE base whose layers are scaled too is \
                     not supported"
                ),
            ));
        } else {
            Some(base)
        }
    } else {
        None
    };
    Ok((scaling, local))
}

/// Block `i`: attention (fused `attn_qkv` or separate q/k/v, optional q/k/v biases as
/// `create_tensor_qkv`), q/k rows and q/k norms brought to the interleaved layout, the norms the
/// family has, the FFN (dense, phi3's fused gate‖up, or experts).
fn read_family_layer(
    table: &TensorTable<'_>,
    arch: &ModelArch,
    family: Arch,
    i: usize,
) -> Result<LayerWeights, LoadError> {
    let (dim, hd, rot) = (arch.dim, arch.head_dim, arch.rotary_dim());
    let (q_dim, kv_dim) = (arch.q_dim(), arch.kv_dim());
    let t = |suffix: &str, shape: &[usize]| table.tensor(&format!("blk.{i}.{suffix}"), shape);
    let rope = |x: HostTensor, heads: usize| {
        if family.gguf.llama { x } else { permute_head_rows(&x, heads, rot, RopeLayout::ToInterleaved) }
    };
    let ([wq, wk, wv], [bq, bk, bv]) = read_qkv(table, i, dim, [q_dim, kv_dim, kv_dim])?;
    let (wq, wk) = (rope(wq, arch.n_heads), rope(wk, arch.n_kv_heads));
    let (bq, bk) = (bq.map(|b| rope(b, arch.n_heads)), bk.map(|b| rope(b, arch.n_kv_heads)));
    let norm_rows = |x: HostTensor| rope(x, 1);
    let (q_norm, k_norm) = if arch.block.qk_norm {
        (Some(norm_rows(t("attn_q_norm.weight", &[hd])?)), Some(norm_rows(t("attn_k_norm.weight", &[hd])?)))
    } else {
        (None, None)
    };
    let gemma = family.block.gemma_norms;
    let gpt_oss = family.block.sinks;
    let ffn_norm = t(&format!("{}.weight", family.gguf.ffn_norm), &[dim])?;
    let ffn = if arch.has_experts(i) {
        Ffn::Experts(read_experts(table, arch, family, i)?)
    } else if family.block.fused {
        let h = arch.hidden_dim;
        let fused = t("ffn_up.weight", &[2 * h, dim])?;
        let (gate, up) = fused.data.split_at(h * dim);
        let m = |d: &[f32]| HostTensor { shape: vec![h, dim], data: d.to_vec() };
        Ffn::Dense(Mlp::new(m(gate), m(up), t("ffn_down.weight", &[dim, h])?))
    } else {
        let h = arch.hidden_dim;
        Ffn::Dense(Mlp::new(
            t("ffn_gate.weight", &[h, dim])?,
            t("ffn_up.weight", &[h, dim])?,
            t("ffn_down.weight", &[dim, h])?,
        ))
    };
    Ok(LayerWeights {
        attn_norm: t("attn_norm.weight", &[dim])?,
        wq,
        wk,
        wv,
        wo: t("attn_output.weight", &[dim, q_dim])?,
        bq,
        bk,
        bv,
        bo: if gpt_oss { Some(t("attn_output.bias", &[dim])?) } else { None },
        q_norm,
        k_norm,
        sinks: if gpt_oss { Some(t("attn_sinks.weight", &[arch.n_heads])?) } else { None },
        post_attn_norm: if gemma { Some(t("post_attention_norm.weight", &[dim])?) } else { None },
        ffn_norm,
        post_ffn_norm: if gemma { Some(t("post_ffw_norm.weight", &[dim])?) } else { None },
        ffn,
    })
}

/// q, k, v weights and optional biases of block `i` as `create_tensor_qkv` loads them: the fused
/// `attn_qkv` (rows q‖k‖v, with an optional fused bias or separate ones) or `attn_q`/`attn_k`/
/// `attn_v`, with optional biases.
///
/// # Shapes
/// - `widths`: the q, k, v output widths; weights `[width, dim]`, biases `[width]`.
fn read_qkv(
    table: &TensorTable<'_>,
    i: usize,
    dim: usize,
    widths: [usize; 3],
) -> Result<([HostTensor; 3], [Option<HostTensor>; 3]), LoadError> {
    let name = |s: &str| format!("blk.{i}.{s}");
    let total = widths.iter().sum::<usize>();
    let split = |t: HostTensor, cols: usize| -> [HostTensor; 3] {
        let mut rest = t.data.as_slice();
        widths.map(|w| {
            let (head, tail) = rest.split_at(w * cols);
            rest = tail;
            let shape = if cols == 1 && t.shape.len() == 1 { vec![w] } else { vec![w, cols] };
            HostTensor { shape, data: head.to_vec() }
        })
    };
    let separate_biases = || -> Result<[Option<HostTensor>; 3], LoadError> {
        Ok([
            table.optional(&name("attn_q.bias"), &[widths[0]])?,
            table.optional(&name("attn_k.bias"), &[widths[1]])?,
            table.optional(&name("attn_v.bias"), &[widths[2]])?,
        ])
    };
    if table.find(&name("attn_qkv.weight")).is_some() {
        let weights = split(table.tensor(&name("attn_qkv.weight"), &[total, dim])?, dim);
        let biases = match table.optional(&name("attn_qkv.bias"), &[total])? {
            Some(b) => split(b, 1).map(Some),
            None => separate_biases()?,
        };
        return Ok((weights, biases));
    }
    let weights = [
        table.tensor(&name("attn_q.weight"), &[widths[0], dim])?,
        table.tensor(&name("attn_k.weight"), &[widths[1], dim])?,
        table.tensor(&name("attn_v.weight"), &[widths[2], dim])?,
    ];
    Ok((weights, separate_biases()?))
}

/// Block `i`'s router and experts: `ffn_gate_inp` `[E, dim]` (+ `.bias` `[E]`, gpt-oss),
/// `ffn_gate_exps`/`ffn_up_exps` `[E, hidden, dim]`, `ffn_down_exps` `[E, dim, hidden]` (ggml
/// dims innermost first: `{dim, hidden, E}`), gpt-oss's expert biases `[E, hidden]`/`[E, dim]`,
/// qwen2moe's shared expert `ffn_{gate,up}_shexp` `[w, dim]`, `ffn_down_shexp` `[dim, w]` and its
/// gate `ffn_gate_inp_shexp` `[dim]` (made `[1, dim]`); every ggml type the reader reads, row by
/// row across the experts.
fn read_experts(table: &TensorTable<'_>, arch: &ModelArch, family: Arch, i: usize) -> Result<Experts, LoadError> {
    let name = |s: &str| format!("blk.{i}.{s}");
    let Some(moe) = &arch.moe else {
        return Err(LoadError::invalid(table.path, "a layer with experts in a model without experts"));
    };
    let (e, h, d) = (moe.n_experts, moe.expert_hidden, arch.dim);
    let gpt_oss = family.block.sinks;
    let router = table.tensor(&name("ffn_gate_inp.weight"), &[e, d])?;
    let router_bias = if gpt_oss {
        Some(table.tensor(&name("ffn_gate_inp.bias"), &[e])?)
    } else if moe.routing.biases_choice_only() {
        // glm4moe's `e_score_correction_bias` (`ffn_exp_probs_b`).
        Some(table.tensor(&name("exp_probs_b.bias"), &[e])?)
    } else {
        None
    };
    let gate = split_outer(table.tensor(&name("ffn_gate_exps.weight"), &[e, h, d])?);
    let up = split_outer(table.tensor(&name("ffn_up_exps.weight"), &[e, h, d])?);
    let down = split_outer(table.tensor(&name("ffn_down_exps.weight"), &[e, d, h])?);
    let bias = |s: &str, w: usize| -> Result<Vec<Option<HostTensor>>, LoadError> {
        if gpt_oss {
            Ok(split_outer(table.tensor(&name(s), &[e, w])?).into_iter().map(Some).collect())
        } else {
            Ok(vec![None; e])
        }
    };
    let (gb, ub, db) = (bias("ffn_gate_exps.bias", h)?, bias("ffn_up_exps.bias", h)?, bias("ffn_down_exps.bias", d)?);
    let experts = (gate.into_iter().zip(up).zip(down))
        .zip(gb.into_iter().zip(ub).zip(db))
        .map(|(((gate, up), down), ((gate_bias, up_bias), down_bias))| Mlp {
            gate,
            up,
            down,
            gate_bias,
            up_bias,
            down_bias,
        })
        .collect();
    let ungated = family.moe.as_ref().is_some_and(|m| m.ungated_shared.is_some());
    let shared = match moe.shared_expert_hidden {
        Some(w) if ungated => Some(SharedExpert {
            mlp: Mlp::new(
                table.tensor(&name("ffn_gate_shexp.weight"), &[w, d])?,
                table.tensor(&name("ffn_up_shexp.weight"), &[w, d])?,
                table.tensor(&name("ffn_down_shexp.weight"), &[d, w])?,
            ),
            gate: HostTensor { shape: vec![0, d], data: Vec::new() },
        }),
        Some(w) => Some(SharedExpert {
            mlp: Mlp::new(
                table.tensor(&name("ffn_gate_shexp.weight"), &[w, d])?,
                table.tensor(&name("ffn_up_shexp.weight"), &[w, d])?,
                table.tensor(&name("ffn_down_shexp.weight"), &[d, w])?,
            ),
            gate: HostTensor { shape: vec![1, d], data: table.tensor(&name("ffn_gate_inp_shexp.weight"), &[d])?.data },
        }),
        None => None,
    };
    Ok(Experts { router, router_bias, experts, shared })
}

/// A tensor split along its outermost dimension.
///
/// # Shapes
/// - `t`: `[n, rest..]`; the result: `n` tensors of `[rest..]`.
pub(crate) fn split_outer(t: HostTensor) -> Vec<HostTensor> {
    let n = t.shape.first().copied().unwrap_or(0);
    let inner: Vec<usize> = t.shape.iter().skip(1).copied().collect();
    let size = inner.iter().product::<usize>();
    if size == 0 {
        return Vec::new();
    }
    t.data.chunks_exact(size).take(n).map(|c| HostTensor { shape: inner.clone(), data: c.to_vec() }).collect()
}
