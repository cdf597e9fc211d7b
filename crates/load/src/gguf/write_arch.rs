//! The GGUF writer's side of the family architectures (`qwen3`, `qwen3moe`, `gemma2`,
//! `gemma3`, `phi3`, `gpt-oss`, `llama` with experts): which one a [`HostModel`] is, whether
//! llama.cpp computes what the model computes (else a refusal naming the feature), the
//! metadata and the tensors as `convert_hf_to_gguf.py` writes them (see [`super::arch`]'s table).
//!
//! - Gemma norms stored as `1 + w` when the model keeps raw `w` ([`NormStyle::OnePlusWeight`],
//!   `conversion/gemma.py` `norm_shift`), as is when it holds `1 + w` already.
//! - q/k rows (and biases, q/k norms) of the NEOX architectures in the rotate-half layout over
//!   the rotated dims; `llama` keeps them interleaved.
//! - phi3: fused `attn_qkv` (q‖k‖v) and `ffn_up` (gate‖up), as its converter leaves them.
//! - experts stacked into `ffn_{gate,up,down}_exps` `[E, rows, cols]`, each expert's stored rows
//!   one after the other; gpt-oss's biases (zeros where the model has none: llama.cpp requires
//!   them) and its router bias.
//! - gpt-oss requires `output.weight`: a tied head is written as a copy of the embedding.

use std::borrow::Cow;
use std::path::Path;

use super::arch::{attn_scale, swa_by_pattern};
use super::read::GgufValue;
use super::write::{GgufMatrix, GgufTensor, Kv, Part, gguf_arch_metadata, llama3_freq_factors};
use crate::LoadError;
use crate::arch::{self, Arch, DenseRule, SoftCaps, Tied};
use crate::rope_layout::RopeLayout::ToRotateHalf;
use crate::rope_layout::{reorder_rows, rotate_half_row_order_partial};
use qdrift_weights::{
    Ffn, HostModel, HostTensor, LayerAttention, LayerWeights, LinearName, Mlp, NormStyle, RopeScaling, Routing,
};

/// The family a model is written as: by its architecture name (GGUF's, `config.json`'s class or
/// a wrapper's, [`arch::by_written_name`]), else the first family of the table whose block is
/// the model's; `None` for a Llama or Qwen2 block (written as `llama`/`qwen2`).
pub(super) fn writer_family(model: &HostModel) -> Option<Arch> {
    arch::by_written_name(&model.arch.architecture).or_else(|| by_features(model))
}

/// The first family whose features the model's block has, asked in the order the features
/// distinguish the families: sinks; sandwich norms (with or without q/k norms); q/k norms (with
/// or without experts); partial rotary; a shared expert; experts.
fn by_features(model: &HostModel) -> Option<Arch> {
    let a = &model.arch;
    let b = &a.block;
    let partial = b.rotary_dim.is_some_and(|r| r != a.head_dim);
    let shared = a.moe.as_ref().is_some_and(|m| m.shared_expert_hidden.is_some());
    let family = |f: &dyn Fn(Arch) -> bool| arch::ARCHITECTURES.iter().filter(|e| !e.gguf.dense).find(|e| f(e));
    if b.sinks {
        family(&|e| e.block.sinks)
    } else if b.sandwich_norms {
        family(&|e| e.block.gemma_norms && e.block.qk_norm == b.qk_norm)
    } else if b.qk_norm {
        family(&|e| e.block.qk_norm && !e.block.gemma_norms && e.moe.is_some() == a.moe.is_some())
    } else if partial {
        family(&|e| e.block.partial_rotary)
    } else if shared {
        family(&|e| e.moe.as_ref().is_some_and(|m| m.shared_expert.is_some()))
    } else if a.moe.is_some() {
        family(&|e| e.gguf.llama && e.moe.is_some())
    } else {
        None
    }
}

/// Refuses, naming the feature, a model whose computation llama.cpp's graph for `family` would
/// not reproduce.
///
/// # Errors
/// [`LoadError::Invalid`]: `"{architecture} cannot be written as GGUF {family}: {feature}"`.
pub(super) fn check_writable(path: &Path, model: &HostModel, family: Arch) -> Result<(), LoadError> {
    let refuse = |why: String| {
        LoadError::invalid(
            path,
            format!("{} cannot be written as GGUF {}: {why}", model.arch.architecture, family.gguf.name),
        )
    };
    let la = &model.arch.layer_attention;
    let nope = family.gguf.rope_layers(model.arch.n_layers);
    if *la != (LayerAttention { rope: nope.clone(), ..LayerAttention::default() }) {
        let why = if la.rope != nope && la.chunks.is_empty() && la.qk_l2_norm.is_none() && la.temperature.is_none() {
            match family.gguf.nope_step {
                Some(step) => format!("its NoPE layers are not llama.cpp's (every {step}th layer, no other)"),
                None => "NoPE layers are not written yet".into(),
            }
        } else {
            "NoPE, chunked or temperature-tuned attention layers are not written yet".into()
        };
        return Err(refuse(why));
    }
    if let Some(feature) = family.gguf.not_read {
        return Err(refuse(format!("{feature} are not written yet")));
    }
    if let Some(why) = block_refusal(model, family) {
        return Err(refuse(why));
    }
    if let Some(why) = layer_refusal(model, family) {
        return Err(refuse(why));
    }
    Ok(())
}

/// What of the architecture's description llama.cpp's `family` does not compute.
fn block_refusal(model: &HostModel, family: Arch) -> Option<String> {
    let a = &model.arch;
    let b = &a.block;
    let name = family.gguf.name;
    let features = &family.block;
    let gemma = features.gemma_norms;
    let activation = features.activation.gguf();
    let close = |x: f32, y: f32, tol: f32| (x - y).abs() <= tol * y.abs();
    if b.norm == NormStyle::OnePlusWeight && !gemma {
        return Some(format!("x·(1+w) RMSNorm (llama.cpp's {name} multiplies by w)"));
    }
    if b.activation != activation {
        return Some(format!("the FFN activation {:?} (llama.cpp's {name} uses {activation:?})", b.activation));
    }
    if b.sandwich_norms != gemma {
        return Some(format!("post-attention and post-FFN norms: {} (llama.cpp's {name}: {gemma})", b.sandwich_norms));
    }
    // glm4moe's q/k norms are optional (`use_qk_norm`).
    if b.qk_norm != features.qk_norm && features.qk_norm_key.is_none() {
        return Some(format!("q/k norms: {} (llama.cpp's {name}: {})", b.qk_norm, features.qk_norm));
    }
    if b.sinks != features.sinks {
        return Some("attention sinks (only gpt-oss has them)".to_string());
    }
    if a.rotary_dim() != a.head_dim && !features.partial_rotary && features.partial_factor.is_none() {
        return Some(format!(
            "partial rotary embeddings ({} of {} dims; only phi3 and glm4moe have them)",
            a.rotary_dim(),
            a.head_dim
        ));
    }
    if family.gguf.q_is_dim_wide && a.head_dim * a.n_heads != a.dim {
        return Some(format!(
            "head_dim {} · {} heads ≠ dim {} ({name}'s q projection is dim wide)",
            a.head_dim, a.n_heads, a.dim
        ));
    }
    let default_scale = 1.0 / (a.head_dim as f32).sqrt();
    let llama_cpp_scale =
        if gemma { attn_scale(family, a.n_layers, a.dim, a.n_heads, a.head_dim) } else { default_scale };
    let scale = b.attn_scale.unwrap_or(default_scale);
    if !close(scale, llama_cpp_scale, 1e-6) {
        return Some(format!(
            "the attention scale {scale} (query_pre_attn_scalar^-½) differs from llama.cpp's {llama_cpp_scale} for {name}"
        ));
    }
    let caps = features.softcaps;
    match (caps, b.attn_softcap) {
        (SoftCaps::AttnAndFinal, None) => {
            return Some(format!("no attention-logit soft cap (llama.cpp's {name} always caps)"));
        }
        (SoftCaps::AttnAndFinal, Some(_)) | (_, None) => {}
        (_, Some(c)) => return Some(format!("attention-logit soft-capping ({c}; only gemma2 has it)")),
    }
    match (caps, a.final_logit_softcap) {
        (SoftCaps::AttnAndFinal, None) => {
            return Some(format!("no final-logit soft cap (llama.cpp's {name} always caps)"));
        }
        (SoftCaps::AttnAndFinal | SoftCaps::Final, _) | (_, None) => {}
        (_, Some(c)) => return Some(format!("final-logit soft-capping ({c}; only gemma2 and gemma3 have it)")),
    }
    match (gemma, a.embedding_scale) {
        (true, Some(s)) if close(s, (a.dim as f32).sqrt(), 5e-3) => {}
        (false, None) => {}
        (_, s) => {
            return Some(format!("the embedding scale {s:?} (llama.cpp's {name}: √dim for Gemma, none otherwise)"));
        }
    }
    if family.gguf.tied == Tied::Always && model.output.is_some() {
        return Some(format!("an untied output head (llama.cpp's {name} always uses the embedding)"));
    }
    window_refusal(model, family).or_else(|| rope_refusal(model, family)).or_else(|| moe_refusal(model, family))
}

/// Sliding windows llama.cpp's `family` cannot express.
fn window_refusal(model: &HostModel, family: Arch) -> Option<String> {
    let a = &model.arch;
    let sizes: Vec<usize> = a.windows.iter().flatten().copied().collect();
    if sizes.is_empty() {
        return None;
    }
    if family.gguf.swa_pattern.is_none() {
        return Some(format!("sliding-window layers (llama.cpp's {} attends fully)", family.gguf.name));
    }
    if sizes.iter().any(|&w| w != sizes[0]) {
        return Some("sliding windows of different sizes".into());
    }
    let local_unscaled = family.block.local_rope_theta.is_some();
    if a.local_rope_theta.is_some() && a.rope_scaling.is_some() && !local_unscaled {
        return Some("a sliding-window RoPE base with RoPE scaling (llama.cpp scales those layers too)".into());
    }
    if a.local_rope_theta.is_none() && a.rope_scaling.is_some() && local_unscaled {
        return Some("scaled RoPE on sliding-window layers (llama.cpp's gemma3 leaves them unscaled)".into());
    }
    None
}

/// RoPE scaling llama.cpp's `family` cannot express.
fn rope_refusal(model: &HostModel, family: Arch) -> Option<String> {
    let a = &model.arch;
    if a.local_rope_theta.is_some() && family.gguf.swa_pattern.is_none() {
        return Some("a separate RoPE base for sliding-window layers".into());
    }
    match &a.rope_scaling {
        None | Some(RopeScaling::Linear { .. }) => None,
        Some(RopeScaling::Yarn { beta_fast, beta_slow, .. }) => {
            if family.gguf.llama {
                Some("YaRN RoPE scaling for llama".into())
            } else if *beta_fast != 32.0 || *beta_slow != 1.0 {
                Some(format!("YaRN beta_fast {beta_fast} / beta_slow {beta_slow} (llama.cpp uses 32 / 1)"))
            } else {
                None
            }
        }
        Some(RopeScaling::FreqFactors { .. } | RopeScaling::Llama3 { .. }) if family.gguf.llama => None,
        Some(RopeScaling::LongRope { .. }) if family.block.partial_rotary => None,
        Some(RopeScaling::LongRope { .. }) => {
            Some(format!("LongRoPE scaling for {} (llama.cpp reads its factors for phi3)", family.gguf.name))
        }
        Some(_) => Some("per-pair RoPE frequency factors (rope_freqs.weight; llama only)".into()),
    }
}

/// A mixture of experts llama.cpp's `family` cannot express.
fn moe_refusal(model: &HostModel, family: Arch) -> Option<String> {
    let a = &model.arch;
    match (&a.moe, family.moe.as_ref()) {
        (None, None) => None,
        (Some(_), None) => Some("a mixture of experts".into()),
        (None, Some(_)) => Some("no mixture of experts".into()),
        (Some(m), Some(rules)) => {
            let leading = (0..m.dense_layers.len()).eq(m.dense_layers.iter().copied());
            let grouped = matches!(rules.gguf_routing, Routing::GroupedSigmoid { .. });
            let leading_ok = leading && matches!(rules.dense_layers, DenseRule::FirstK(_));
            if !(m.dense_layers.is_empty() || leading_ok) {
                Some(format!("dense FFN layers {:?} among the expert layers", m.dense_layers))
            } else if m.shared_expert_hidden.is_some()
                && rules.shared_expert.is_none()
                && rules.ungated_shared.is_none()
                || m.shared_expert_hidden.is_none() && rules.shared_expert.is_some()
            {
                Some(format!(
                    "{} (llama.cpp's {} has {})",
                    if m.shared_expert_hidden.is_some() { "a shared expert" } else { "no shared expert" },
                    family.gguf.name,
                    if rules.shared_expert.is_some() { "one" } else { "none" }
                ))
            } else if rules.ungated_shared.is_some()
                && m.shared_expert_hidden.is_some_and(|w| m.expert_hidden == 0 || w % m.expert_hidden != 0)
            {
                Some(format!(
                    "a shared expert {:?} wide, not a multiple of the expert width {} (llama.cpp's {} counts \
                     shared experts)",
                    m.shared_expert_hidden, m.expert_hidden, family.gguf.name
                ))
            } else if grouped && !matches!(m.routing, Routing::GroupedSigmoid { .. })
                || !grouped && m.routing != rules.gguf_routing
            {
                Some(format!("routing {:?} (llama.cpp's {}: {:?})", m.routing, family.gguf.name, rules.gguf_routing))
            } else {
                None
            }
        }
    }
}

/// What of a layer's weights llama.cpp's `family` does not load.
fn layer_refusal(model: &HostModel, family: Arch) -> Option<String> {
    let gpt_oss = family.block.sinks;
    let a = &model.arch;
    let choice_bias = a.moe.as_ref().is_some_and(|m| m.routing.biases_choice_only());
    let ungated = family.moe.as_ref().is_some_and(|m| m.ungated_shared.is_some());
    let qkv = |l: &LayerWeights| [&l.bq, &l.bk, &l.bv].iter().filter(|b| b.is_some()).count();
    let first = model.layers.first().map_or(0, qkv);
    for (i, l) in model.layers.iter().enumerate() {
        if qkv(l) != first || (first != 0 && first != 3) {
            return Some("q/k/v biases in some layers or projections only".into());
        }
        if l.bo.is_some() && !gpt_oss {
            return Some(format!("an attention output bias (layer {i}; only gpt-oss has one)"));
        }
        if (l.q_norm.is_some() && l.k_norm.is_some()) != a.block.qk_norm {
            return Some(format!("q/k norm weights in layer {i} do not match the q/k-norm flag"));
        }
        if gpt_oss && l.sinks.is_none() {
            return Some(format!("layer {i} has no attention sinks"));
        }
        if family.block.gemma_norms && (l.post_attn_norm.is_none() || l.post_ffn_norm.is_none()) {
            return Some(format!("layer {i} lacks its post-attention or post-FFN norm"));
        }
        let mlp_bias = |m: &Mlp| m.gate_bias.is_some() || m.up_bias.is_some() || m.down_bias.is_some();
        match &l.ffn {
            Ffn::Dense(m) if mlp_bias(m) => return Some(format!("feed-forward biases (layer {i})")),
            Ffn::Dense(_) if a.has_experts(i) => return Some(format!("a dense FFN in layer {i}")),
            Ffn::Experts(_) if !a.has_experts(i) => return Some(format!("experts in layer {i}")),
            Ffn::Experts(e) if !gpt_oss && e.experts.iter().any(mlp_bias) => {
                return Some(format!("expert biases (layer {i}; only gpt-oss has them)"));
            }
            Ffn::Experts(e) if !gpt_oss && !choice_bias && e.router_bias.is_some() => {
                return Some(format!("a router bias (layer {i}; only gpt-oss and glm4moe have one)"));
            }
            Ffn::Experts(e) if e.shared.as_ref().is_some_and(|s| (s.gate.shape.first() == Some(&0)) != ungated) => {
                return Some(format!(
                    "a shared expert {} (layer {i}; llama.cpp's {}'s is {})",
                    if ungated { "with a gate" } else { "without a gate" },
                    family.gguf.name,
                    if ungated { "ungated" } else { "gated" }
                ));
            }
            Ffn::Experts(e) if e.shared.as_ref().is_some_and(|s| mlp_bias(&s.mlp)) => {
                return Some(format!("shared-expert biases (layer {i})"));
            }
            _ => {}
        }
    }
    None
}

/// `general.*` and the `ARCH.*` keys of `family` (see [`super::arch`]'s table).
pub(super) fn family_metadata(
    kv: &mut Kv,
    path: &Path,
    (model, name): (&HostModel, &str),
    family: Arch,
) -> Result<(), LoadError> {
    let a = &model.arch;
    let arch = family.gguf.name;
    gguf_arch_metadata(kv, path, (a, name), arch)?;
    let u = |x: usize| u32::try_from(x).map_err(|_| LoadError::invalid(path, format!("{x} does not fit a u32")));
    let k = |key: &str| format!("{arch}.{key}");
    // `gguf_arch_metadata` wrote them when head_dim is not dim / n_heads; the converters of the
    // newer families always write them (their configs have `head_dim`).
    if a.head_dim * a.n_heads == a.dim && !family.gguf.llama {
        kv.u32(&k("attention.key_length"), u(a.head_dim)?);
        kv.u32(&k("attention.value_length"), u(a.head_dim)?);
    }
    if let Some(m) = &a.moe {
        kv.u32(&k("expert_count"), u(m.n_experts)?);
        kv.u32(&k("expert_used_count"), u(m.top_k)?);
        if !family.gguf.llama {
            kv.u32(&k("expert_feed_forward_length"), u(m.expert_hidden)?);
        }
        if let Some(w) = m.shared_expert_hidden {
            match family.moe.as_ref().and_then(|r| r.ungated_shared) {
                // glm4moe: `n_ff_shexp = n_ff_exp * n_expert_shared` (`moe_refusal` checked the width).
                Some(_) => kv.u32(&k("expert_shared_count"), u(w / m.expert_hidden.max(1))?),
                None => kv.u32(&k("expert_shared_feed_forward_length"), u(w)?),
            }
        }
        if let Routing::GroupedSigmoid { n_group, topk_group, renormalize, scale } = m.routing {
            // `Glm4MoeModel.set_gguf_parameters`; llama.cpp reads the groups for every architecture.
            kv.u32(&k("leading_dense_block_count"), u(m.dense_layers.len())?);
            kv.u32(&k("expert_gating_func"), 2);
            kv.f32(&k("expert_weights_scale"), scale);
            kv.value(&k("expert_weights_norm"), &GgufValue::Bool(renormalize));
            kv.u32(&k("expert_group_count"), u(n_group)?);
            kv.u32(&k("expert_group_used_count"), u(topk_group)?);
        }
    }
    if family.gguf.nextn {
        // qdrift holds no MTP layers (the Hugging Face reader drops them): none follow the blocks.
        kv.u32(&k("nextn_predict_layers"), 0);
    }
    if family.block.softcaps == SoftCaps::AttnAndFinal {
        kv.f32(&k("attn_logit_softcapping"), a.block.attn_softcap.unwrap_or(50.0));
    }
    if let Some(c) = a.final_logit_softcap {
        kv.f32(&k("final_logit_softcapping"), c);
    }
    if let Some(pattern) = family.gguf.swa_pattern {
        let window = a.windows.iter().flatten().next().copied();
        let is_swa: Vec<bool> = (0..a.n_layers).map(|i| a.window(i).is_some()).collect();
        // A family whose windows are optional writes none without them.
        if window.is_some() || family.gguf.sliding_window != Some(0) {
            kv.u32(&k("attention.sliding_window"), u(window.unwrap_or(a.max_seq_len))?);
            if is_swa.iter().enumerate().any(|(il, &s)| s != swa_by_pattern(pattern, il)) {
                kv.value(
                    &k("attention.sliding_window_pattern"),
                    &GgufValue::Array(is_swa.into_iter().map(GgufValue::Bool).collect()),
                );
            }
        }
        match (a.local_rope_theta, window) {
            (Some(t), _) => kv.f32(&k("rope.freq_base_swa"), t),
            (None, Some(_)) if family.block.local_rope_theta.is_some() => {
                kv.f32(&k("rope.freq_base_swa"), a.rope_theta)
            }
            _ => {}
        }
    }
    rope_metadata(kv, path, model, family)
}

/// `rope.scaling.*`: linear as type and factor; YaRN as type, factor, original context, β, and
/// `rope.scaling.attn_factor` when the attention factor is not llama.cpp's `1 + 0.1·ln factor`;
/// phi3's LongRoPE as original context and attention factor (as `conversion/phi.py` writes it,
/// without a type; its factors are tensors, [`family_tensors`]).
fn rope_metadata(kv: &mut Kv, path: &Path, model: &HostModel, family: Arch) -> Result<(), LoadError> {
    let k = |key: &str| format!("{}.{key}", family.gguf.name);
    match &model.arch.rope_scaling {
        Some(RopeScaling::Linear { factor }) => {
            kv.string(&k("rope.scaling.type"), "linear");
            kv.f32(&k("rope.scaling.factor"), *factor);
        }
        Some(RopeScaling::Yarn {
            factor,
            beta_fast,
            beta_slow,
            original_max_position_embeddings,
            attention_factor,
            ..
        }) => {
            kv.string(&k("rope.scaling.type"), "yarn");
            kv.f32(&k("rope.scaling.factor"), *factor);
            let orig = u32::try_from(*original_max_position_embeddings)
                .map_err(|_| LoadError::invalid(path, "original_max_position_embeddings does not fit a u32"))?;
            kv.u32(&k("rope.scaling.original_context_length"), orig);
            kv.f32(&k("rope.scaling.yarn_beta_fast"), *beta_fast);
            kv.f32(&k("rope.scaling.yarn_beta_slow"), *beta_slow);
            let mscale = if *factor <= 1.0 { 1.0 } else { 1.0 + 0.1 * factor.ln() };
            let extra = attention_factor / mscale;
            if (extra - 1.0).abs() > 1e-6 {
                kv.f32(&k("rope.scaling.attn_factor"), extra);
            }
        }
        Some(RopeScaling::LongRope { original_max_position_embeddings, attention_factor, .. }) => {
            let orig = u32::try_from(*original_max_position_embeddings)
                .map_err(|_| LoadError::invalid(path, "original_max_position_embeddings does not fit a u32"))?;
            kv.u32(&k("rope.scaling.original_context_length"), orig);
            kv.f32(&k("rope.scaling.attn_factor"), *attention_factor);
        }
        _ => {}
    }
    Ok(())
}

/// Every tensor of a `family` model in file order, under llama.cpp's names.
pub(super) fn family_tensors<'a>(
    path: &Path,
    model: &'a HostModel,
    family: Arch,
) -> Result<Vec<GgufTensor<'a>>, LoadError> {
    let a = &model.arch;
    let norm = |t: &'a HostTensor| -> Cow<'a, HostTensor> {
        if family.block.gemma_norms && a.block.norm == NormStyle::OnePlusWeight {
            Cow::Owned(HostTensor { shape: t.shape.clone(), data: t.data.iter().map(|w| 1.0 + w).collect() })
        } else {
            Cow::Borrowed(t)
        }
    };
    let vector = |name: String, t: Cow<'a, HostTensor>| GgufTensor { name, tensor: t, parts: Vec::new() };
    let emb = GgufMatrix::TokenEmbedding;
    let mut tensors = vec![GgufTensor {
        name: "token_embd.weight".into(),
        tensor: Cow::Borrowed(&model.token_embedding),
        parts: vec![Part::of(emb, &model.token_embedding)],
    }];
    if let Some(s) = &a.rope_scaling
        && family.gguf.llama
    {
        let factors = match s {
            RopeScaling::FreqFactors { factors } => Some(factors.clone()),
            RopeScaling::Llama3 { .. } => llama3_freq_factors(s, a.head_dim, a.rope_theta),
            _ => None,
        };
        if let Some(f) = factors {
            tensors.push(vector("rope_freqs.weight".into(), Cow::Owned(HostTensor { shape: vec![f.len()], data: f })));
        }
    }
    if let Some(RopeScaling::LongRope { short_factor, long_factor, .. }) = &a.rope_scaling
        && family.block.partial_rotary
    {
        // `Phi3MiniModel.generate_extra_tensors`: `[rotary_dim / 2]` f32, long then short.
        for (name, f) in [("rope_factors_long.weight", long_factor), ("rope_factors_short.weight", short_factor)] {
            tensors.push(vector(name.into(), Cow::Owned(HostTensor { shape: vec![f.len()], data: f.clone() })));
        }
    }
    for (i, l) in model.layers.iter().enumerate() {
        layer_tensors(&mut tensors, model, family, i, l, &norm)?;
    }
    tensors.push(vector("output_norm.weight".into(), norm(&model.final_norm)));
    match (&model.output, family.gguf.output_required) {
        (Some(o), _) => tensors.push(GgufTensor {
            name: "output.weight".into(),
            tensor: Cow::Borrowed(o),
            parts: vec![Part::of(GgufMatrix::Output, o)],
        }),
        // llama.cpp's gpt-oss and qwen2moe loaders require `output.weight`.
        (None, true) => tensors.push(GgufTensor {
            name: "output.weight".into(),
            tensor: Cow::Borrowed(&model.token_embedding),
            parts: vec![Part::of(emb, &model.token_embedding)],
        }),
        (None, false) => {}
    }
    let _ = path;
    Ok(tensors)
}

/// Block `i`'s tensors.
fn layer_tensors<'a>(
    out: &mut Vec<GgufTensor<'a>>,
    model: &'a HostModel,
    family: Arch,
    i: usize,
    l: &'a LayerWeights,
    norm: &dyn Fn(&'a HostTensor) -> Cow<'a, HostTensor>,
) -> Result<(), LoadError> {
    let a = &model.arch;
    let b = format!("blk.{i}");
    let (hd, rot) = (a.head_dim, a.rotary_dim());
    let lin = |role: &'static str| GgufMatrix::Linear { layer: i, short_name: LinearName::dense(role) };
    let order = |heads: usize| (!family.gguf.llama).then(|| rotate_half_row_order_partial(heads, hd, rot));
    let rope = |t: &HostTensor, heads: usize| -> HostTensor {
        match order(heads) {
            Some(o) => reorder_rows(t, &o, ToRotateHalf),
            None => t.clone(),
        }
    };
    let vector = |name: String, t: Cow<'a, HostTensor>| GgufTensor { name, tensor: t, parts: Vec::new() };
    let part =
        |m: GgufMatrix, t: &HostTensor, heads: Option<usize>| Part { order: heads.and_then(order), ..Part::of(m, t) };
    out.push(vector(format!("{b}.attn_norm.weight"), norm(&l.attn_norm)));
    let q = part(lin("self_attn.q_proj"), &l.wq, Some(a.n_heads));
    let k = part(lin("self_attn.k_proj"), &l.wk, Some(a.n_kv_heads));
    let v = part(lin("self_attn.v_proj"), &l.wv, None);
    let (wq, wk) = (rope(&l.wq, a.n_heads), rope(&l.wk, a.n_kv_heads));
    if family.block.fused {
        out.push(GgufTensor {
            name: format!("{b}.attn_qkv.weight"),
            tensor: Cow::Owned(concat_rows(&[&wq, &wk, &l.wv])),
            parts: vec![q, k, v],
        });
    } else {
        out.push(GgufTensor { name: format!("{b}.attn_q.weight"), tensor: Cow::Owned(wq), parts: vec![q] });
        out.push(GgufTensor { name: format!("{b}.attn_k.weight"), tensor: Cow::Owned(wk), parts: vec![k] });
        out.push(GgufTensor { name: format!("{b}.attn_v.weight"), tensor: Cow::Borrowed(&l.wv), parts: vec![v] });
    }
    if let (Some(bq), Some(bk), Some(bv)) = (&l.bq, &l.bk, &l.bv) {
        out.push(vector(format!("{b}.attn_q.bias"), Cow::Owned(rope(bq, a.n_heads))));
        out.push(vector(format!("{b}.attn_k.bias"), Cow::Owned(rope(bk, a.n_kv_heads))));
        out.push(vector(format!("{b}.attn_v.bias"), Cow::Borrowed(bv)));
    }
    out.push(GgufTensor {
        name: format!("{b}.attn_output.weight"),
        tensor: Cow::Borrowed(&l.wo),
        parts: vec![Part::of(lin("self_attn.o_proj"), &l.wo)],
    });
    if family.block.sinks {
        out.push(vector(format!("{b}.attn_output.bias"), or_zeros(l.bo.as_ref(), &[a.dim])));
        let sinks = l.sinks.as_ref().map_or_else(|| Cow::Owned(zeros(&[a.n_heads])), Cow::Borrowed);
        out.push(vector(format!("{b}.attn_sinks.weight"), sinks));
    }
    if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
        out.push(vector(format!("{b}.attn_q_norm.weight"), Cow::Owned(rope(&norm(qn), 1))));
        out.push(vector(format!("{b}.attn_k_norm.weight"), Cow::Owned(rope(&norm(kn), 1))));
    }
    if let Some(n) = &l.post_attn_norm {
        out.push(vector(format!("{b}.post_attention_norm.weight"), norm(n)));
    }
    // gpt-oss's and glm4moe's pre-FFN norm is stored as `post_attention_norm`.
    out.push(vector(format!("{b}.{}.weight", family.gguf.ffn_norm), norm(&l.ffn_norm)));
    match &l.ffn {
        Ffn::Dense(m) if family.block.fused => {
            let (g, u) = (Part::of(lin("mlp.gate_proj"), &m.gate), Part::of(lin("mlp.up_proj"), &m.up));
            out.push(GgufTensor {
                name: format!("{b}.ffn_up.weight"),
                tensor: Cow::Owned(concat_rows(&[&m.gate, &m.up])),
                parts: vec![g, u],
            });
            out.push(GgufTensor {
                name: format!("{b}.ffn_down.weight"),
                tensor: Cow::Borrowed(&m.down),
                parts: vec![Part::of(lin("mlp.down_proj"), &m.down)],
            });
        }
        Ffn::Dense(m) => {
            for (name, role, t) in [
                ("ffn_gate", "mlp.gate_proj", &m.gate),
                ("ffn_up", "mlp.up_proj", &m.up),
                ("ffn_down", "mlp.down_proj", &m.down),
            ] {
                out.push(GgufTensor {
                    name: format!("{b}.{name}.weight"),
                    tensor: Cow::Borrowed(t),
                    parts: vec![Part::of(lin(role), t)],
                });
            }
        }
        Ffn::Experts(e) => expert_tensors(out, model, family, i, e)?,
    }
    if let Some(n) = &l.post_ffn_norm {
        out.push(vector(format!("{b}.post_ffw_norm.weight"), norm(n)));
    }
    Ok(())
}

/// One matrix of an expert.
type ExpertMatrix = fn(&Mlp) -> &HostTensor;

/// One bias of an expert.
type ExpertBias = fn(&Mlp) -> Option<&HostTensor>;

/// A layer's router and stacked experts (`ffn_gate_inp`, `ffn_{gate,up,down}_exps`, gpt-oss's
/// biases, qwen2moe's shared expert `ffn_{gate,up,down}_shexp` and its gate `ffn_gate_inp_shexp`
/// `[dim]`).
fn expert_tensors<'a>(
    out: &mut Vec<GgufTensor<'a>>,
    model: &'a HostModel,
    family: Arch,
    i: usize,
    e: &'a qdrift_weights::Experts,
) -> Result<(), LoadError> {
    let a = &model.arch;
    let b = format!("blk.{i}");
    let n = e.experts.len();
    let hidden = a.moe.as_ref().map_or(0, |m| m.expert_hidden);
    let vector = |name: String, t: Cow<'a, HostTensor>| GgufTensor { name, tensor: t, parts: Vec::new() };
    out.push(vector(format!("{b}.ffn_gate_inp.weight"), Cow::Borrowed(&e.router)));
    if family.block.sinks {
        out.push(vector(format!("{b}.ffn_gate_inp.bias"), or_zeros(e.router_bias.as_ref(), &[n])));
    }
    if a.moe.as_ref().is_some_and(|m| m.routing.biases_choice_only()) {
        // glm4moe's `e_score_correction_bias` (`ffn_exp_probs_b`, `{n_expert}`).
        out.push(vector(format!("{b}.exp_probs_b.bias"), or_zeros(e.router_bias.as_ref(), &[n])));
    }
    let roles: [(&str, &'static str, ExpertMatrix); 3] = [
        ("ffn_gate_exps", "mlp.gate_proj", |m| &m.gate),
        ("ffn_up_exps", "mlp.up_proj", |m| &m.up),
        ("ffn_down_exps", "mlp.down_proj", |m| &m.down),
    ];
    for (name, role, get) in roles {
        let mats: Vec<&HostTensor> = e.experts.iter().map(get).collect();
        let parts = mats
            .iter()
            .enumerate()
            .map(|(x, t)| {
                Part::of(GgufMatrix::Linear { layer: i, short_name: LinearName { role, expert: Some(x) } }, t)
            })
            .collect();
        out.push(GgufTensor { name: format!("{b}.{name}.weight"), tensor: Cow::Owned(stack(&mats)), parts });
    }
    if family.block.sinks {
        let biases: [(&str, ExpertBias, usize); 3] = [
            ("ffn_gate_exps", |m| m.gate_bias.as_ref(), hidden),
            ("ffn_up_exps", |m| m.up_bias.as_ref(), hidden),
            ("ffn_down_exps", |m| m.down_bias.as_ref(), a.dim),
        ];
        for (name, get, w) in biases {
            let rows: Vec<HostTensor> = e.experts.iter().map(|m| or_zeros(get(m), &[w]).into_owned()).collect();
            out.push(vector(format!("{b}.{name}.bias"), Cow::Owned(stack(&rows.iter().collect::<Vec<_>>()))));
        }
    }
    if let Some(sh) = &e.shared {
        // `qwen2moe.cpp`: `ffn_gate_inp_shexp` is `{n_embd}`; glm4moe's shared experts are ungated.
        if sh.gate.shape.first() != Some(&0) {
            let gate = HostTensor { shape: vec![a.dim], data: sh.gate.data.clone() };
            out.push(vector(format!("{b}.ffn_gate_inp_shexp.weight"), Cow::Owned(gate)));
        }
        let m = &sh.mlp;
        for (name, role, t) in [
            ("ffn_gate_shexp", "mlp.shared_expert.gate_proj", &m.gate),
            ("ffn_up_shexp", "mlp.shared_expert.up_proj", &m.up),
            ("ffn_down_shexp", "mlp.shared_expert.down_proj", &m.down),
        ] {
            let part = Part::of(GgufMatrix::Linear { layer: i, short_name: LinearName::dense(role) }, t);
            out.push(GgufTensor { name: format!("{b}.{name}.weight"), tensor: Cow::Borrowed(t), parts: vec![part] });
        }
    }
    Ok(())
}

/// `t`, or zeros of `shape` when the model has none.
fn or_zeros<'a>(t: Option<&'a HostTensor>, shape: &[usize]) -> Cow<'a, HostTensor> {
    t.map_or_else(|| Cow::Owned(zeros(shape)), Cow::Borrowed)
}

fn zeros(shape: &[usize]) -> HostTensor {
    HostTensor { shape: shape.to_vec(), data: vec![0.0; shape.iter().product()] }
}

/// Matrices with the same columns, one under the other.
///
/// # Shapes
/// - `parts`: `[r_i, cols]` each; the result `[Σ r_i, cols]`.
fn concat_rows(parts: &[&HostTensor]) -> HostTensor {
    let rows = parts.iter().map(|t| t.shape.first().copied().unwrap_or(0)).sum();
    let cols = parts.first().map_or(0, |t| t.shape.get(1).copied().unwrap_or(1));
    HostTensor { shape: vec![rows, cols], data: parts.iter().flat_map(|t| t.data.iter().copied()).collect() }
}

/// Tensors of one shape stacked along a new outer dimension.
///
/// # Shapes
/// - `parts`: `n` tensors of `s`; the result `[n, s..]`.
fn stack(parts: &[&HostTensor]) -> HostTensor {
    let mut shape = vec![parts.len()];
    shape.extend(parts.first().map_or(Vec::new(), |t| t.shape.clone()));
    HostTensor { shape, data: parts.iter().flat_map(|t| t.data.iter().copied()).collect() }
}
