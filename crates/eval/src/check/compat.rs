//! Whether a checkpoint variant is a quantization of the reference, checked before any model is
//! built: an evaluation of another model gives numbers that look like a quantization's drift and
//! mean nothing, and a refusal after the reference has run wastes the run.
//!
//! A checkpoint is a quantization of the reference when it has the same architecture family, the
//! same block structure (layers, widths, heads, head size, block features, window pattern,
//! experts and their routing, RoPE, norms), the same number of parameters and the same optional
//! tensors, and the same tokenizer. Every tensor's shape follows from the architecture: each
//! reader checks every tensor against it when it opens the file, which is what
//! [`open_variants`] does, before the reference runs.
//!
//! `--allow-different-model` ([`crate::EvalConfig::allow_different_model`]) accepts a variant
//! whose architecture differs; the tokenizer must still be the reference's (the metrics compare
//! token ids and distributions over one vocabulary), and the report names the first difference
//! at the top.

use std::path::Path;
use std::sync::Arc;

use qdrift_load::{LayerWeights, LoadedModel, ModelArch, WeightSource, open_source};

use crate::error::EvalError;
use crate::inputs::identity::checkpoint_hash;

/// A checkpoint variant opened part by part, as the reference is.
pub(crate) type OpenedCheckpoint = LoadedModel<Arc<dyn WeightSource>>;

/// A checkpoint variant opened and checked against the reference.
pub(crate) struct CheckedCheckpoint {
    /// The checkpoint, its weights read when its model is built.
    pub model: OpenedCheckpoint,
    /// The first way it differs from the reference, when `--allow-different-model` accepted it.
    pub different_model: Option<String>,
    /// Its SHA-256 and, for a folder, its files' ([`checkpoint_hash`]): hashed here, before the
    /// run, so that a folder holding a pipe or a link loop is refused before any work.
    pub hash: (String, Vec<qdrift_report::FileHash>),
}

/// Opens every checkpoint of `paths` (`None` for a variant that is no checkpoint, in order) and
/// checks it against `reference`, whose prompts encode as `prompts`: the first that is not a
/// quantization of the reference is refused naming its first difference, unless
/// `allow_different` (then only a different tokenizer is refused).
pub(crate) fn open_variants<'a>(
    paths: impl Iterator<Item = Option<&'a Path>>,
    reference: &OpenedCheckpoint,
    prompts: &[Vec<u32>],
    allow_different: bool,
) -> Result<Vec<Option<CheckedCheckpoint>>, EvalError> {
    paths.map(|p| p.map(|p| open_checked(p, reference, prompts, allow_different)).transpose()).collect()
}

fn open_checked(
    path: &Path,
    reference: &OpenedCheckpoint,
    prompts: &[Vec<u32>],
    allow_different: bool,
) -> Result<CheckedCheckpoint, EvalError> {
    let refuse = |problem: String| EvalError::Variant { variant: path.display().to_string(), problem };
    let hash = checkpoint_hash(path)?;
    let model = open_source(path, None, &|_| {})?;
    // The structure first: a model of another shape usually has another tokenizer too, and the
    // shape says more of what it is.
    let difference = first_difference(reference, &model).map_err(|e| refuse(e.to_string()))?;
    let different_model = match difference {
        None => None,
        Some(difference) if allow_different => Some(difference),
        Some(difference) => {
            return Err(refuse(format!(
                "is not a quantization of the reference: {difference} (--allow-different-model compares it anyway)"
            )));
        }
    };
    check_tokenizer(reference, &model, prompts).map_err(refuse)?;
    Ok(CheckedCheckpoint { model, different_model, hash })
}

/// The family of an architecture name, the same for a Hugging Face class and the GGUF
/// `general.architecture` a conversion of it carries (llama.cpp's `convert_hf_to_gguf.py` writes
/// Mistral and Mixtral as `llama`); a name qdrift does not know stands for itself.
pub(crate) fn family(architecture: &str) -> String {
    let known = [
        ("LlamaForCausalLM", "llama"),
        ("MistralForCausalLM", "llama"),
        ("MixtralForCausalLM", "llama"),
        ("Qwen2ForCausalLM", "qwen2"),
        ("Qwen3ForCausalLM", "qwen3"),
        ("Qwen3MoeForCausalLM", "qwen3moe"),
        ("Qwen2MoeForCausalLM", "qwen2moe"),
        ("Gemma2ForCausalLM", "gemma2"),
        ("Gemma3ForCausalLM", "gemma3"),
        ("Phi3ForCausalLM", "phi3"),
        ("GptOssForCausalLM", "gpt-oss"),
    ];
    known
        .iter()
        .find(|(class, _)| *class == architecture)
        .map_or_else(|| architecture.to_lowercase(), |(_, f)| f.to_string())
}

/// The first way `variant` differs from `reference` in structure, in words (`its experts ... differ
/// from the reference's ...`), or `None`; reading a layer of either may fail.
fn first_difference(
    reference: &OpenedCheckpoint,
    variant: &OpenedCheckpoint,
) -> Result<Option<String>, qdrift_load::SourceError> {
    let (ours, theirs) = (reference.model.arch(), variant.model.arch());
    if let Some(d) = arch_difference(ours, theirs) {
        return Ok(Some(d));
    }
    let (a, b) = (body_parameters(&*reference.model), body_parameters(&*variant.model));
    if a != b {
        return Ok(Some(format!("it holds {b} parameters outside the output layer, the reference {a}")));
    }
    // The optional tensors a layer carries (biases, q/k norms, sinks, ...) are not in the
    // architecture: compare the first and the last layer's.
    for i in [0, ours.n_layers.saturating_sub(1)] {
        if ours.n_layers == 0 {
            break;
        }
        let (a, b) = (layer_signature(&reference.model.layer(i)?), layer_signature(&variant.model.layer(i)?));
        if a != b {
            return Ok(Some(format!("layer {i}'s tensors {b} differ from the reference's {a}")));
        }
    }
    Ok(None)
}

/// Parameters outside the output layer: a quantized file may store a tied head on its own.
fn body_parameters(source: &dyn WeightSource) -> usize {
    let arch = source.arch();
    let head = if arch.tied_embeddings { 0 } else { arch.vocab_size * arch.dim };
    source.parameter_count().saturating_sub(head)
}

/// Each tensor of a layer by name with its shape, in a fixed order.
fn layer_signature(layer: &LayerWeights) -> String {
    let optional = [
        ("q bias", &layer.bq),
        ("k bias", &layer.bk),
        ("v bias", &layer.bv),
        ("o bias", &layer.bo),
        ("q norm", &layer.q_norm),
        ("k norm", &layer.k_norm),
        ("sinks", &layer.sinks),
        ("post-attention norm", &layer.post_attn_norm),
        ("post-FFN norm", &layer.post_ffn_norm),
    ];
    let mut parts: Vec<String> = layer.linears().into_iter().map(|(name, t)| format!("{name} {:?}", t.shape)).collect();
    parts.extend(optional.iter().filter_map(|(name, t)| t.as_ref().map(|t| format!("{name} {:?}", t.shape))));
    format!("({})", parts.join(", "))
}

/// The first field of the architecture in which `theirs` differs from `ours`, in words.
fn arch_difference(ours: &ModelArch, theirs: &ModelArch) -> Option<String> {
    let (fo, ft) = (family(&ours.architecture), family(&theirs.architecture));
    if fo != ft {
        return Some(format!(
            "its architecture {} ({ft}) differs from the reference's {} ({fo})",
            theirs.architecture, ours.architecture
        ));
    }
    let debug = |x: &dyn std::fmt::Debug| format!("{x:?}");
    let fields: [(&str, String, String); 14] = [
        ("layers", debug(&ours.n_layers), debug(&theirs.n_layers)),
        ("hidden size", debug(&ours.dim), debug(&theirs.dim)),
        ("feed-forward width", debug(&ours.hidden_dim), debug(&theirs.hidden_dim)),
        ("attention heads", debug(&ours.n_heads), debug(&theirs.n_heads)),
        ("key/value heads", debug(&ours.n_kv_heads), debug(&theirs.n_kv_heads)),
        ("head size", debug(&ours.head_dim()), debug(&theirs.head_dim())),
        ("vocabulary (embedding rows)", debug(&ours.vocab_size), debug(&theirs.vocab_size)),
        ("block", debug(&ours.block), debug(&theirs.block)),
        ("sliding-window pattern", debug(&ours.windows), debug(&theirs.windows)),
        ("experts", debug(&ours.moe), debug(&theirs.moe)),
        ("RoPE theta", debug(&ours.rope_theta), debug(&theirs.rope_theta)),
        ("local RoPE theta", debug(&ours.local_rope_theta), debug(&theirs.local_rope_theta)),
        ("embedding scale", debug(&ours.embedding_scale), debug(&theirs.embedding_scale)),
        ("final logit soft cap", debug(&ours.final_logit_softcap), debug(&theirs.final_logit_softcap)),
    ];
    if let Some((what, a, b)) = fields.into_iter().find(|(_, a, b)| a != b) {
        return Some(format!("its {what} {b} differs from the reference's {a}"));
    }
    if ours.norm_eps != theirs.norm_eps {
        return Some(format!("its RMSNorm epsilon {} differs from the reference's {}", theirs.norm_eps, ours.norm_eps));
    }
    rope_scaling_difference(ours, theirs)
}

/// RoPE scaling compared where both say it the same way: a GGUF conversion stores a Hugging Face
/// config's Llama 3 scaling as per-pair factors (`rope_freqs.weight`), another form of the same
/// frequencies.
fn rope_scaling_difference(ours: &ModelArch, theirs: &ModelArch) -> Option<String> {
    let same_form = match (&ours.rope_scaling, &theirs.rope_scaling) {
        (None, None) => return None,
        (Some(a), Some(b)) => std::mem::discriminant(a) == std::mem::discriminant(b),
        _ => true,
    };
    (same_form && ours.rope_scaling != theirs.rope_scaling).then(|| {
        format!("its RoPE scaling {:?} differs from the reference's {:?}", theirs.rope_scaling, ours.rope_scaling)
    })
}

/// Refuses a checkpoint whose tokenizer differs from the reference's.
fn check_tokenizer(reference: &OpenedCheckpoint, other: &OpenedCheckpoint, prompts: &[Vec<u32>]) -> Result<(), String> {
    // A checkpoint may pad its tokenizer to the embedding's rows (convert_hf_to_gguf.py writes
    // `[PADn]` tokens up to `vocab_size` for Qwen3's 151669 tokens in 151936 rows, while the
    // Hugging Face folder's tokenizer.json stops at 151669): sizes may differ up to the shared
    // embedding size, provided every token both have decodes the same.
    let (rt, ot) = (&reference.tokenizer, &other.tokenizer);
    let (ours, theirs) = (rt.vocab_size(), ot.vocab_size());
    if ours != theirs {
        if ours.max(theirs) > reference.model.arch().vocab_size {
            return Err(format!("its tokenizer has {theirs} tokens, the reference's {ours}"));
        }
        let differs = |&id: &u32| ot.decode(&[id]) != rt.decode(&[id]);
        if let Some(id) = (0..ours.min(theirs) as u32).find(differs) {
            return Err(format!(
                "its tokenizer has {theirs} tokens, the reference's {ours}, and token {id} differs between them"
            ));
        }
    }
    for (i, p) in prompts.iter().enumerate() {
        let text = rt.decode(p);
        if ot.encode(&text) != rt.encode(&text) {
            return Err(format!("its tokenizer encodes prompt {} differently from the reference's", i + 1));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversion_keeps_its_family() {
        assert_eq!(family("MistralForCausalLM"), family("llama"));
        assert_eq!(family("Qwen3MoeForCausalLM"), family("qwen3moe"));
        assert_ne!(family("Qwen3MoeForCausalLM"), family("Qwen3ForCausalLM"));
        assert_eq!(family("SomethingNew"), "somethingnew");
    }

    /// Each part of the block structure the issue lists (layers, heads, head size, experts and
    /// their top-k, window pattern, vocabulary, block features) is a difference on its own,
    /// named with both values; the same architecture is none.
    #[test]
    fn every_structural_difference_is_named() {
        use qdrift_load::{MoeSpec, Routing};
        let ours = qdrift_load::synthetic_arch("llama-1b").expect("preset");
        assert_eq!(arch_difference(&ours, &ours.clone()), None);
        let moe = |top_k| MoeSpec {
            n_experts: 8,
            top_k,
            expert_hidden: 64,
            routing: Routing::SoftmaxTopK { renormalize: true },
            dense_layers: Vec::new(),
            shared_expert_hidden: None,
        };
        let with_moe = ModelArch { moe: Some(moe(2)), ..ours.clone() };
        let cases: Vec<(ModelArch, &ModelArch, &str)> = vec![
            (
                ModelArch { n_layers: ours.n_layers - 1, ..ours.clone() },
                &ours,
                "its layers 15 differs from the reference's 16",
            ),
            (ModelArch { n_heads: ours.n_heads * 2, ..ours.clone() }, &ours, "its attention heads 64 differs"),
            (
                ModelArch { n_kv_heads: 4, ..ours.clone() },
                &ours,
                "its key/value heads 4 differs from the reference's 8",
            ),
            (ModelArch { head_dim: 32, ..ours.clone() }, &ours, "its head size 32 differs from the reference's 64"),
            (ModelArch { vocab_size: 32000, ..ours.clone() }, &ours, "its vocabulary (embedding rows) 32000 differs"),
            (with_moe.clone(), &ours, "its experts Some(MoeSpec { n_experts: 8, top_k: 2"),
            (ModelArch { moe: Some(moe(4)), ..ours.clone() }, &with_moe, "top_k: 4"),
            (ModelArch { windows: vec![Some(4096), None], ..ours.clone() }, &ours, "its sliding-window pattern"),
            (
                ModelArch { block: qdrift_load::BlockSpec { qk_norm: true, ..ours.block }, ..ours.clone() },
                &ours,
                "its block ",
            ),
            (
                ModelArch { architecture: "Qwen3ForCausalLM".into(), ..ours.clone() },
                &ours,
                "its architecture Qwen3ForCausalLM (qwen3)",
            ),
        ];
        for (theirs, reference, says) in &cases {
            let d = arch_difference(reference, theirs).unwrap_or_else(|| panic!("{says}: no difference found"));
            assert!(d.contains(says), "{d:?} should say {says:?}");
        }
    }
}
