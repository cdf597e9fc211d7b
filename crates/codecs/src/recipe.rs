//! A variant as production runs it: weights, and optionally activations and the KV cache.
//!
//! The grammar is `WEIGHTS[+a-ACT][+kv-KV]`, the same for `qdrift eval`, `generate` and
//! `quantize`:
//! - `WEIGHTS` is a [`Scheme`] name (`int4-g128`, `fp8-e4m3`, `q4_k`, …), or a shorthand that
//!   also sets the activation part: `w8a8-int8` = `int8+a-int8` (per-channel int8 weights,
//!   dynamic per-token int8 activations, as SmoothQuant and vLLM's W8A8-INT8), `w8a8-fp8` =
//!   `fp8-e4m3+a-fp8` (per-channel E4M3 weights, dynamic per-token E4M3 activations, as vLLM's
//!   and TensorRT-LLM's FP8), `w4a4-mxfp4` = `mxfp4-ct+a-mxfp4` and `w4a4-nvfp4` =
//!   `nvfp4+a-nvfp4` (FP4 weights and activations by compressed-tensors' rules, its `MXFP4` and
//!   `NVFP4` presets, as vLLM serves them).
//! - `ACT` ([`ActivationQuant`]): `int8`, `fp8-e4m3`, `fp8-e5m2` (`fp8` is `fp8-e4m3`), each
//!   per token, per tensor with `-tensor`, or per token and group of `G` consecutive inputs with
//!   `-gG` (`fp8-g128`: the dynamic activations of block-FP8 checkpoints such as DeepSeek-V3 and
//!   Qwen3-FP8, whose group is their weight block's width). The 4-bit floats carry their block:
//!   `mxfp4` = `mxfp4-ct` (E8M0 scale per 32, compressed-tensors' and vLLM's scale rule), `mxfp4-ocp` (the
//!   OCP spec's rule) and `nvfp4` (E4M3 scale per 16 under a static global input scale), the
//!   activations of W4A4 checkpoints.
//! - `KV` ([`KvQuant`]): `fp8-e4m3`, `fp8-e5m2` (scale 1, vLLM's default), `fp8-e4m3-head`,
//!   `fp8-e5m2-head` (dynamic scale per token per head), `int8` (per token per head),
//!   `q8_0`, `q4_0` (ggml blocks of 32 along a token's `kv_heads × head_dim` row, as llama.cpp's
//!   `-ctk/-ctv`).
//!
//! Every existing scheme name keeps its meaning: `int4-g128` is weight-only, as before. A
//! recipe prints in one canonical form ([`std::fmt::Display`]), which parses back to itself:
//! the shorthands print as themselves, `a-fp8-e4m3` prints as `a-fp8`. The host definitions of
//! the activation and KV roundings are in `dynamic.rs`.

use std::fmt;
use std::str::FromStr;

use qdrift_ggml::GgmlType;
use qdrift_io::elide;

use crate::error::QuantizeError;
use crate::scheme::{Fp8Format, Mxfp4Rule, Scheme};

/// The number format of dynamically quantized values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DynamicFormat {
    /// Symmetric int8 in [−127, 127]: `s = amax/127`, `q = RNE(x/s)`.
    Int8,
    /// OCP FP8 (the project's saturating round-to-nearest-even codec): `s = amax/max_finite`.
    Fp8(Fp8Format),
    /// MXFP4 (OCP MX v1.0): E2M1 elements, one E8M0 power-of-two scale per 32 inputs, chosen by
    /// compressed-tensors' rule (`mxfp4`: the amax rounded up a binade from a mantissa of 1.75,
    /// as vLLM's reference `qdq_mxfp4_torch` and AMD Quark's `"even"` mode, what vLLM's MXFP4
    /// activation emulation runs) or the OCP spec's (`mxfp4-ocp`: `floor(log2 amax) − 2`, §6.3,
    /// torchao's default).
    Mxfp4(Mxfp4Rule),
    /// NVFP4: E2M1 elements, one E4M3 scale per 16 inputs under a static f32 global input scale.
    Nvfp4,
}

impl DynamicFormat {
    /// The largest magnitude a scaled value maps to: 127, the FP8 format's max normal, or 6
    /// (E2M1).
    pub fn max_value(self) -> f32 {
        match self {
            DynamicFormat::Int8 => 127.0,
            DynamicFormat::Fp8(f) => f.max_finite(),
            DynamicFormat::Mxfp4(_) | DynamicFormat::Nvfp4 => qdrift_ggml::E2M1_MAX,
        }
    }

    /// The block a 4-bit float format's scale covers (32 for MXFP4, 16 for NVFP4); `None` for
    /// int8 and FP8, whose scale's extent is the [`ActivationScale`]'s.
    pub fn block(self) -> Option<usize> {
        match self {
            DynamicFormat::Mxfp4(_) => Some(32),
            DynamicFormat::Nvfp4 => Some(16),
            DynamicFormat::Int8 | DynamicFormat::Fp8(_) => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            DynamicFormat::Int8 => "int8",
            DynamicFormat::Fp8(Fp8Format::E4M3) => "fp8-e4m3",
            DynamicFormat::Fp8(Fp8Format::E5M2) => "fp8-e5m2",
            DynamicFormat::Mxfp4(Mxfp4Rule::CompressedTensors) => "mxfp4",
            DynamicFormat::Mxfp4(Mxfp4Rule::Ocp) => "mxfp4-ocp",
            DynamicFormat::Nvfp4 => "nvfp4",
        }
    }
}

/// Which activations share one dynamic scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActivationScale {
    /// One scale per token (vLLM's dynamic per-token scale).
    Token,
    /// One scale over all of a sequence's prompt tokens in the prompt pass (padding excluded),
    /// then one per token, as vLLM's dynamic per-tensor scale at batch size 1 (prefill, then one
    /// token per decoding step). Rows of a batch never share a scale, so results stay
    /// independent of how prompts are batched, and teacher forcing rounds as generation does.
    Tensor,
    /// One scale per token and group of this many consecutive inputs, as vLLM's
    /// `per_token_group_quant_fp8` and DeepSeek-V3's `act_quant` (block-FP8 checkpoints, groups of
    /// 128). The group must divide every linear layer's input width
    /// ([`ActivationQuant::check_width`]), as both references assert.
    TokenGroup(usize),
}

/// Dynamic quantization of the input of every quantized linear layer (q/k/v, o, gate/up and
/// down; the embedding and the output head are not linear inputs that vLLM quantizes either).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ActivationQuant {
    /// int8 or FP8.
    pub format: DynamicFormat,
    /// Which values share one scale.
    pub scale: ActivationScale,
}

impl ActivationQuant {
    /// The group size [`ActivationQuant::all`] lists for per-token-group scales (block-FP8
    /// checkpoints' 128); any positive group parses.
    pub const LISTED_GROUP: usize = 128;

    /// Every activation part, in the order help lists them (per-token groups with
    /// [`ActivationQuant::LISTED_GROUP`]), the 4-bit float blocks last.
    pub fn all() -> Vec<ActivationQuant> {
        let formats = [DynamicFormat::Int8, DynamicFormat::Fp8(Fp8Format::E4M3), DynamicFormat::Fp8(Fp8Format::E5M2)];
        [ActivationScale::Token, ActivationScale::Tensor, ActivationScale::TokenGroup(Self::LISTED_GROUP)]
            .into_iter()
            .flat_map(|scale| formats.map(|format| ActivationQuant { format, scale }))
            .chain(
                [
                    DynamicFormat::Mxfp4(Mxfp4Rule::CompressedTensors),
                    DynamicFormat::Mxfp4(Mxfp4Rule::Ocp),
                    DynamicFormat::Nvfp4,
                ]
                .map(Self::fp4),
            )
            .collect()
    }

    /// A 4-bit float format's activations: per token and block of its [`DynamicFormat::block`].
    ///
    /// # Panics
    /// If `format` is int8 or FP8 (no block of its own).
    pub fn fp4(format: DynamicFormat) -> ActivationQuant {
        let block = format.block().expect("a 4-bit float format");
        ActivationQuant { format, scale: ActivationScale::TokenGroup(block) }
    }

    /// Checks that a linear layer's input of `cols` values splits into whole groups (always true
    /// for per-token and per-tensor scales), and that a 4-bit float format is scaled per block of
    /// its own size (a hand-built part could say otherwise).
    ///
    /// # Errors
    /// [`QuantizeError::ActivationRow`] naming the part, the width and the group;
    /// [`QuantizeError::BadRecipe`] for a 4-bit float format with another scale.
    pub fn check_width(&self, cols: usize) -> Result<(), QuantizeError> {
        if let Some(block) = self.format.block()
            && self.scale != ActivationScale::TokenGroup(block)
        {
            return Err(QuantizeError::BadRecipe {
                name: format!("{}/{:?}", self.format.name(), self.scale),
                problem: format!("{} activations are scaled per block of {block}", self.format.name()),
                grammar: Recipe::grammar(),
            });
        }
        match self.scale {
            ActivationScale::TokenGroup(group) if group == 0 || !cols.is_multiple_of(group) => {
                Err(QuantizeError::ActivationRow { activations: self.to_string(), cols, group })
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for ActivationQuant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.format {
            DynamicFormat::Fp8(Fp8Format::E4M3) => "fp8",
            other => other.name(),
        };
        if self.format.block().is_some_and(|b| self.scale == ActivationScale::TokenGroup(b)) {
            return f.write_str(name);
        }
        match self.scale {
            ActivationScale::Token => write!(f, "{name}"),
            ActivationScale::Tensor => write!(f, "{name}-tensor"),
            ActivationScale::TokenGroup(g) => write!(f, "{name}-g{g}"),
        }
    }
}

/// `-gG` with `G` a positive decimal integer written without leading zeros (so that a part
/// prints back as it was written).
fn group_suffix(s: &str) -> Option<(&str, usize)> {
    let (base, digits) = s.rsplit_once("-g")?;
    if digits.is_empty() || digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((base, digits.parse().ok()?))
}

impl FromStr for ActivationQuant {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        // The 4-bit float formats carry their block: no scale suffix.
        let fp4 = [
            DynamicFormat::Mxfp4(Mxfp4Rule::CompressedTensors),
            DynamicFormat::Mxfp4(Mxfp4Rule::Ocp),
            DynamicFormat::Nvfp4,
        ];
        if let Some(format) = fp4.into_iter().find(|f| f.name() == s) {
            return Ok(ActivationQuant::fp4(format));
        }
        if s == "mxfp4-ct" {
            return Ok(ActivationQuant::fp4(DynamicFormat::Mxfp4(Mxfp4Rule::CompressedTensors)));
        }
        let (base, scale) = if let Some(base) = s.strip_suffix("-tensor") {
            (base, ActivationScale::Tensor)
        } else if let Some((base, group)) = group_suffix(s) {
            (base, ActivationScale::TokenGroup(group))
        } else {
            (s, ActivationScale::Token)
        };
        let format = match base {
            "int8" => DynamicFormat::Int8,
            "fp8" | "fp8-e4m3" => DynamicFormat::Fp8(Fp8Format::E4M3),
            "fp8-e5m2" => DynamicFormat::Fp8(Fp8Format::E5M2),
            _ => return Err(()),
        };
        Ok(ActivationQuant { format, scale })
    }
}

/// Rounding of every key (after RoPE) and value as it is written into the KV cache; every later
/// step reads the rounded values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvQuant {
    /// OCP FP8 with scale 1 (vLLM's `kv_cache_dtype=fp8` default), saturating at the format's
    /// max.
    Fp8(Fp8Format),
    /// OCP FP8 with a dynamic scale per token per head: `s = amax(head)/max_finite`.
    Fp8PerHead(Fp8Format),
    /// Symmetric int8 per token per head: `s = amax(head)/127`, `q = RNE(x/s)`.
    Int8,
    /// A ggml block type (q8_0 or q4_0), blocks of 32 along a token's `kv_heads × head_dim` row,
    /// bit-exact with `quantize_row_*_ref` then `dequantize_row_*`.
    Ggml(GgmlType),
}

impl KvQuant {
    /// Every KV-cache part, in the order help lists them.
    pub fn all() -> Vec<KvQuant> {
        vec![
            KvQuant::Fp8(Fp8Format::E4M3),
            KvQuant::Fp8(Fp8Format::E5M2),
            KvQuant::Fp8PerHead(Fp8Format::E4M3),
            KvQuant::Fp8PerHead(Fp8Format::E5M2),
            KvQuant::Int8,
            KvQuant::Ggml(GgmlType::Q8_0),
            KvQuant::Ggml(GgmlType::Q4_0),
        ]
    }

    /// Checks that a cache row of `kv_heads × head_dim` values can be stored: the ggml block
    /// formats need whole blocks of 32 along the row, as llama.cpp's cache does.
    ///
    /// # Errors
    /// [`QuantizeError::KvRow`] naming the format and the row width; [`QuantizeError::Ggml`]
    /// for a hand-built `KvQuant::Ggml` of a read-only GGML type (none is listed).
    pub fn check_row(&self, kv_heads: usize, head_dim: usize) -> Result<(), QuantizeError> {
        let row = kv_heads.saturating_mul(head_dim);
        match self {
            KvQuant::Ggml(ty) if !ty.has_quantizer() => Err(qdrift_ggml::GgmlError::NoQuantizer { ty: *ty }.into()),
            // The device roundings (`qdrift-model`) implement the two cache types llama.cpp's
            // `-ctk/-ctv` users pick; a hand-built recipe with another block type is refused.
            KvQuant::Ggml(ty) if !matches!(ty, GgmlType::Q8_0 | GgmlType::Q4_0) => Err(QuantizeError::BadRecipe {
                name: self.to_string(),
                problem: format!("{} is not a KV-cache format", ty.name()),
                grammar: Recipe::grammar(),
            }),
            KvQuant::Ggml(ty) if !row.is_multiple_of(ty.block_size()) => {
                Err(QuantizeError::KvRow { format: self.to_string(), row, kv_heads, head_dim, block: ty.block_size() })
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for KvQuant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvQuant::Fp8(format) => write!(f, "{}", DynamicFormat::Fp8(*format).name()),
            KvQuant::Fp8PerHead(format) => write!(f, "{}-head", DynamicFormat::Fp8(*format).name()),
            KvQuant::Int8 => f.write_str("int8"),
            KvQuant::Ggml(ty) => f.write_str(ty.name()),
        }
    }
}

impl FromStr for KvQuant {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        KvQuant::all().into_iter().find(|k| k.to_string() == s).ok_or(())
    }
}

/// A variant: its weight scheme, and what it quantizes at run time. See the module doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Recipe {
    /// How the linear weights are stored.
    pub weights: Scheme,
    /// Dynamic quantization of the linear layers' inputs, if any.
    pub activations: Option<ActivationQuant>,
    /// Rounding of the KV cache, if any.
    pub kv_cache: Option<KvQuant>,
}

/// The W8A8 and W4A4 shorthands: name, weights, activations.
const SHORTHANDS: [(&str, Scheme, ActivationQuant); 4] = [
    ("w8a8-int8", Scheme::Int8, ActivationQuant { format: DynamicFormat::Int8, scale: ActivationScale::Token }),
    (
        "w8a8-fp8",
        Scheme::Fp8 { format: Fp8Format::E4M3, per_tensor: false },
        ActivationQuant { format: DynamicFormat::Fp8(Fp8Format::E4M3), scale: ActivationScale::Token },
    ),
    (
        "w4a4-mxfp4",
        Scheme::Mxfp4 { rule: Mxfp4Rule::CompressedTensors },
        ActivationQuant {
            format: DynamicFormat::Mxfp4(Mxfp4Rule::CompressedTensors),
            scale: ActivationScale::TokenGroup(32),
        },
    ),
    (
        "w4a4-nvfp4",
        Scheme::Nvfp4,
        ActivationQuant { format: DynamicFormat::Nvfp4, scale: ActivationScale::TokenGroup(16) },
    ),
];

impl Recipe {
    /// Weights only, as every scheme was before activations and the KV cache could be quantized.
    pub fn weight_only(weights: Scheme) -> Self {
        Self { weights, activations: None, kv_cache: None }
    }

    /// Whether only the weights are quantized.
    pub fn is_weight_only(&self) -> bool {
        self.activations.is_none() && self.kv_cache.is_none()
    }

    /// The grammar and every valid part, for error messages and `--help`.
    pub fn grammar() -> String {
        let list = |v: Vec<String>| v.join(", ");
        let mut weights: Vec<String> = Scheme::all().iter().map(Scheme::to_string).collect();
        weights.extend(SHORTHANDS.iter().map(|(n, ..)| n.to_string()));
        format!(
            "a variant is WEIGHTS[+a-ACT][+kv-KV]; WEIGHTS: {}; ACT: {} (fp8 = fp8-e4m3; -gG: any group G); KV: {}",
            list(weights),
            list(ActivationQuant::all().iter().map(ToString::to_string).collect()),
            list(KvQuant::all().iter().map(ToString::to_string).collect()),
        )
    }

    /// The shorthands (`w8a8-int8`, `w8a8-fp8`, `w4a4-mxfp4`, `w4a4-nvfp4`) and the recipes they
    /// stand for, for help.
    pub fn shorthands() -> impl Iterator<Item = Recipe> {
        SHORTHANDS.iter().map(|&(_, weights, a)| Recipe { weights, activations: Some(a), kv_cache: None })
    }

    /// The shorthand naming this recipe's weights and activations, if there is one.
    fn shorthand(&self) -> Option<&'static str> {
        SHORTHANDS.iter().find(|(_, w, a)| self.weights == *w && self.activations == Some(*a)).map(|(name, ..)| *name)
    }
}

impl From<Scheme> for Recipe {
    fn from(weights: Scheme) -> Self {
        Recipe::weight_only(weights)
    }
}

impl fmt::Display for Recipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.shorthand() {
            Some(name) => f.write_str(name)?,
            None => {
                write!(f, "{}", self.weights)?;
                if let Some(a) = self.activations {
                    write!(f, "+a-{a}")?;
                }
            }
        }
        if let Some(kv) = self.kv_cache {
            write!(f, "+kv-{kv}")?;
        }
        Ok(())
    }
}

impl FromStr for Recipe {
    type Err = QuantizeError;

    /// Parses `WEIGHTS[+a-ACT][+kv-KV]` (see the module doc).
    ///
    /// # Errors
    /// [`QuantizeError::BadRecipe`] saying which part is wrong, with the grammar and every valid
    /// part.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        let bad = |problem: String| QuantizeError::BadRecipe {
            name: elide(name).into_owned(),
            problem,
            grammar: Recipe::grammar(),
        };
        let mut parts = name.split('+');
        let weights = parts.next().unwrap_or_default();
        let mut recipe = if let Some((_, w, a)) = SHORTHANDS.iter().find(|(n, ..)| *n == weights) {
            Recipe { weights: *w, activations: Some(*a), kv_cache: None }
        } else if weights.is_empty() {
            return Err(bad("the weight scheme is missing (use fp16 to leave the weights unquantized)".into()));
        } else {
            let scheme = Scheme::from_str(weights).map_err(|_| {
                bad(format!("unknown weight scheme `{}`{}", elide(weights), crate::formats::scheme_hint(weights)))
            })?;
            Recipe::weight_only(scheme)
        };
        for part in parts {
            if let Some(act) = part.strip_prefix("a-") {
                if recipe.kv_cache.is_some() {
                    return Err(bad(format!(
                        "`+{}` comes after the KV-cache part; write +a-… before +kv-…",
                        elide(part)
                    )));
                }
                if recipe.activations.is_some() {
                    return Err(bad(format!("more than one activation part (`+{}`)", elide(part))));
                }
                let a = act.parse().map_err(|()| bad(format!("unknown activation format `{}`", elide(act))))?;
                recipe.activations = Some(a);
            } else if let Some(kv) = part.strip_prefix("kv-") {
                if recipe.kv_cache.is_some() {
                    return Err(bad(format!("more than one KV-cache part (`+{}`)", elide(part))));
                }
                recipe.kv_cache =
                    Some(kv.parse().map_err(|()| bad(format!("unknown KV-cache format `{}`", elide(kv))))?);
            } else {
                return Err(bad(format!(
                    "`+{}` is neither an activation part (+a-…) nor a KV-cache part (+kv-…)",
                    elide(part)
                )));
            }
        }
        Ok(recipe)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Recipe {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn a_long_bad_recipe_is_quoted_short_once() {
        let long = format!("int8+a-{}", "x".repeat(100_000));
        let e = long.parse::<Recipe>().unwrap_err().to_string();
        assert!(e.len() < 2 * Recipe::grammar().len() + 400, "{} bytes", e.len());
        assert!(e.contains("…(100007 bytes)…") && e.contains("…(100000 bytes)…"), "{e}");
        assert_eq!(e.lines().count(), 1);
    }

    #[test]
    fn every_scheme_name_keeps_its_meaning() {
        for scheme in Scheme::all() {
            let r = parse(&scheme.to_string());
            assert_eq!(r, Recipe::weight_only(scheme));
            assert_eq!(r.to_string(), scheme.to_string());
        }
    }

    #[test]
    fn the_issue_examples_parse_to_their_parts() {
        let int8_token = ActivationQuant { format: DynamicFormat::Int8, scale: ActivationScale::Token };
        let fp8_token = ActivationQuant { format: DynamicFormat::Fp8(Fp8Format::E4M3), scale: ActivationScale::Token };
        assert_eq!(parse("w8a8-int8"), Recipe { weights: Scheme::Int8, activations: Some(int8_token), kv_cache: None });
        let fp8_w = Scheme::Fp8 { format: Fp8Format::E4M3, per_tensor: false };
        assert_eq!(parse("w8a8-fp8"), Recipe { weights: fp8_w, activations: Some(fp8_token), kv_cache: None });
        assert_eq!(parse("fp8-e4m3+a-fp8"), parse("w8a8-fp8"));
        assert_eq!(parse("int8+a-int8").to_string(), "w8a8-int8");
        let r = parse("fp8-e4m3+a-fp8-tensor");
        assert_eq!(r.activations, Some(ActivationQuant { scale: ActivationScale::Tensor, ..fp8_token }));
        assert_eq!(r.to_string(), "fp8-e4m3+a-fp8-tensor");
        let r = parse("int4-g128+kv-q8_0");
        assert_eq!(
            (r.weights.to_string().as_str(), r.activations, r.kv_cache),
            ("int4-g128", None, Some(KvQuant::Ggml(GgmlType::Q8_0)))
        );
        let r = parse("fp16+kv-fp8-e4m3");
        assert_eq!((r.weights, r.kv_cache), (Scheme::Fp16, Some(KvQuant::Fp8(Fp8Format::E4M3))));
        assert_eq!(parse("w8a8-fp8+kv-q4_0").to_string(), "w8a8-fp8+kv-q4_0");
        assert_eq!(parse("fp8-e4m3+a-fp8-e4m3").to_string(), "w8a8-fp8");
        let names: Vec<String> = Recipe::shorthands().map(|r| r.to_string()).collect();
        assert_eq!(names, ["w8a8-int8", "w8a8-fp8", "w4a4-mxfp4", "w4a4-nvfp4"]);
    }

    #[test]
    fn every_combination_round_trips() {
        let mut n = 0;
        for w in Scheme::all() {
            for a in std::iter::once(None).chain(ActivationQuant::all().into_iter().map(Some)) {
                for kv in std::iter::once(None).chain(KvQuant::all().into_iter().map(Some)) {
                    let r = Recipe { weights: w, activations: a, kv_cache: kv };
                    assert_eq!(parse(&r.to_string()), r, "{r}");
                    n += 1;
                }
            }
        }
        assert!(n > 1000);
    }

    #[test]
    fn bad_strings_get_one_clear_error_listing_the_valid_parts() {
        for (s, says) in [
            ("int4-g128+kv-q3", "unknown KV-cache format `q3`"),
            ("+a-int8+a-fp8", "the weight scheme is missing"),
            ("int8+a-int8+a-fp8", "more than one activation part"),
            ("w8a8-int8+a-fp8", "more than one activation part"),
            ("w8a8-int4", "unknown weight scheme `w8a8-int4`"),
            ("int4_g128", "unknown weight scheme `int4_g128` (did you mean int4-g128?)"),
            ("q4_k_m+kv-q8_0", "llama.cpp's Q4_K_M is a file type"),
            ("int8+kv-int8+a-int8", "write +a-… before +kv-…"),
            ("int8+kv-int8+kv-q8_0", "more than one KV-cache part"),
            ("int8+q8_0", "neither an activation part"),
            ("int8+a-fp16", "unknown activation format `fp16`"),
            ("", "the weight scheme is missing"),
        ] {
            let e = s.parse::<Recipe>().expect_err(s).to_string();
            assert!(e.contains(says), "{s}: {e}");
            assert!(!e.contains('\n'), "{s}: one line: {e}");
            for listed in ["WEIGHTS[+a-ACT][+kv-KV]", "int4-g128", "w8a8-fp8", "ACT: int8", "q4_0", "fp8-e5m2-head"] {
                assert!(e.contains(listed), "{s}: {e} lists {listed}");
            }
        }
    }

    #[test]
    fn per_token_group_parts_parse_print_and_check_widths() {
        let fp8_g =
            |g| ActivationQuant { format: DynamicFormat::Fp8(Fp8Format::E4M3), scale: ActivationScale::TokenGroup(g) };
        let r = parse("fp8-e4m3+a-fp8-g128");
        assert_eq!(r.activations, Some(fp8_g(128)));
        assert_eq!(r.to_string(), "fp8-e4m3+a-fp8-g128");
        assert_eq!(parse("fp8-e4m3+a-fp8-e4m3-g4").to_string(), "fp8-e4m3+a-fp8-g4");
        assert_eq!(parse("int8+a-int8-g32+kv-q8_0").to_string(), "int8+a-int8-g32+kv-q8_0");
        let e5 = parse("fp16+a-fp8-e5m2-g64").activations.expect("activations");
        assert_eq!((e5.format, e5.scale), (DynamicFormat::Fp8(Fp8Format::E5M2), ActivationScale::TokenGroup(64)));
        for g in [1, 4, 7, 128, 4096] {
            let r = Recipe { activations: Some(fp8_g(g)), ..Recipe::weight_only(Scheme::Fp16) };
            assert_eq!(parse(&r.to_string()), r);
        }
        // A group of 0, leading zeros or signs would not print back as written.
        for bad in ["fp16+a-fp8-g0", "fp16+a-fp8-g0128", "fp16+a-fp8-g+4", "fp16+a-fp8-g", "fp16+a-fp8-g4-tensor"] {
            let e = bad.parse::<Recipe>().expect_err(bad).to_string();
            assert!(e.contains("unknown activation format"), "{bad}: {e}");
        }
        assert!(fp8_g(32).check_width(64).is_ok());
        let e = fp8_g(32).check_width(172).expect_err("172 = 5·32 + 12").to_string();
        assert!(e.contains("fp8-g32") && e.contains("172") && e.contains("32-value groups"), "{e}");
        assert!(fp8_g(0).check_width(64).is_err(), "a hand-built group of 0");
        assert!(ActivationQuant { scale: ActivationScale::Token, ..fp8_g(1) }.check_width(172).is_ok());
    }

    #[test]
    fn fp4_parts_carry_their_block_and_w4a4_mxfp4_is_a_shorthand() {
        let mx = ActivationQuant::fp4(DynamicFormat::Mxfp4(Mxfp4Rule::CompressedTensors));
        assert_eq!(mx.scale, ActivationScale::TokenGroup(32));
        let r = parse("w4a4-mxfp4");
        let ct = Scheme::Mxfp4 { rule: Mxfp4Rule::CompressedTensors };
        assert_eq!(r, Recipe { weights: ct, activations: Some(mx), kv_cache: None });
        assert_eq!(parse("mxfp4-ct+a-mxfp4"), r);
        assert_eq!(parse("mxfp4-ct+a-mxfp4-ct"), r, "mxfp4-ct is mxfp4 for activations too");
        let nv4 = parse("w4a4-nvfp4+kv-fp8-e4m3");
        assert_eq!((nv4.weights, nv4.to_string().as_str()), (Scheme::Nvfp4, "w4a4-nvfp4+kv-fp8-e4m3"));
        assert_eq!(parse("w4a4-mxfp4+kv-fp8-e4m3").to_string(), "w4a4-mxfp4+kv-fp8-e4m3");
        let nv = parse("fp16+a-nvfp4").activations.expect("nvfp4");
        assert_eq!((nv.format, nv.scale), (DynamicFormat::Nvfp4, ActivationScale::TokenGroup(16)));
        assert_eq!(parse("int4-g128+a-mxfp4-ocp").to_string(), "int4-g128+a-mxfp4-ocp");
        for bad in ["fp16+a-nvfp4-g32", "fp16+a-mxfp4-tensor", "fp16+a-nvfp4-ocp"] {
            assert!(bad.parse::<Recipe>().is_err(), "{bad}");
        }
        assert!(mx.check_width(64).is_ok() && mx.check_width(48).is_err());
        let hand_built = ActivationQuant { scale: ActivationScale::Token, ..mx };
        let e = hand_built.check_width(64).expect_err("per token").to_string();
        assert!(e.contains("per block of 32"), "{e}");
    }

    #[test]
    fn ggml_kv_rows_must_hold_whole_blocks() {
        let q8 = KvQuant::Ggml(GgmlType::Q8_0);
        assert!(q8.check_row(4, 8).is_ok()); // stories260K: 32
        assert!(q8.check_row(3, 64).is_ok()); // SmolLM2-135M: 192
        assert!(KvQuant::Ggml(GgmlType::Q4_1).check_row(4, 8).is_err(), "only q8_0 and q4_0 caches");
        let e = q8.check_row(3, 10).expect_err("30 values").to_string();
        assert!(e.contains("q8_0") && e.contains("30") && e.contains("32"), "{e}");
        assert!(KvQuant::Int8.check_row(3, 10).is_ok());
    }
}
