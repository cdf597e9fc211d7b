//! Quantization schemes and their CLI names.
//!
//! A [`Scheme`] names a format and its parameters; [`crate::quantize`] applies it. The CLI name
//! of every scheme round-trips through [`std::fmt::Display`] and [`std::str::FromStr`].

use std::fmt;
use std::str::FromStr;

pub use qdrift_ggml::GgmlType;

use crate::error::QuantizeError;

/// The two OCP 8-bit floating point formats (OFP8 rev 1.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Format {
    /// 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; max normal 448.
    E4M3,
    /// 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like inf/NaN; max normal 57344.
    E5M2,
}

impl Fp8Format {
    /// Largest finite magnitude of the format.
    pub fn max_finite(self) -> f32 {
        match self {
            Fp8Format::E4M3 => 448.0,
            Fp8Format::E5M2 => 57344.0,
        }
    }

    fn cli(self) -> &'static str {
        match self {
            Fp8Format::E4M3 => "e4m3",
            Fp8Format::E5M2 => "e5m2",
        }
    }
}

/// A weight quantization scheme. See [`Scheme::describe`] for each one in a sentence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// Round each weight to IEEE binary16.
    Fp16,
    /// Round each weight to bfloat16.
    Bf16,
    /// Symmetric int8, one f32 scale per output channel.
    Int8,
    /// 4-bit integers with one FP16 scale per `group` consecutive inputs of a row.
    Int4 {
        /// Elements per group along a row.
        group: usize,
        /// Asymmetric (scale + 4-bit zero point) instead of symmetric.
        asym: bool,
    },
    /// OCP FP8 with an f32 scale per output channel, or per tensor.
    Fp8 {
        /// E4M3 or E5M2.
        format: Fp8Format,
        /// One scale for the whole tensor instead of one per row.
        per_tensor: bool,
    },
    /// QLoRA NormalFloat4 with an f32 absmax per block of `block` inputs of a row.
    Nf4 {
        /// Elements per absmax block along a row (64 in QLoRA).
        block: usize,
    },
    /// A GGML block format, bit-exact with ggml's reference quantizer.
    Ggml(GgmlType),
}

impl Scheme {
    /// Every scheme with a CLI name, in the order `--help` lists them.
    pub fn all() -> Vec<Scheme> {
        let mut all = vec![Scheme::Fp16, Scheme::Bf16, Scheme::Int8];
        for asym in [false, true] {
            for group in [32, 64, 128] {
                all.push(Scheme::Int4 { group, asym });
            }
        }
        for per_tensor in [false, true] {
            for format in [Fp8Format::E4M3, Fp8Format::E5M2] {
                all.push(Scheme::Fp8 { format, per_tensor });
            }
        }
        all.push(Scheme::Nf4 { block: 64 });
        all.extend(GgmlType::ALL.map(Scheme::Ggml));
        all
    }

    /// One sentence for `--help`.
    pub fn describe(&self) -> &'static str {
        match self {
            Scheme::Fp16 => "IEEE half precision, each weight rounded to nearest even (16 bits/weight).",
            Scheme::Bf16 => "bfloat16, each weight rounded to nearest even (16 bits/weight).",
            Scheme::Int8 => "Symmetric int8 per output channel, scale = absmax/127 in f32 (8 + 32/cols bits/weight).",
            Scheme::Int4 { asym: false, .. } => {
                "Symmetric 4-bit integers in [-8, 7] with one FP16 scale = absmax/7 per group of a row."
            }
            Scheme::Int4 { asym: true, .. } => {
                "Asymmetric 4-bit integers in [0, 15] with an FP16 scale and a 4-bit zero point per group of a row."
            }
            Scheme::Fp8 { format: Fp8Format::E4M3, per_tensor: false } => {
                "OCP FP8 E4M3 (max 448) with one f32 scale per output channel."
            }
            Scheme::Fp8 { format: Fp8Format::E5M2, per_tensor: false } => {
                "OCP FP8 E5M2 (max 57344) with one f32 scale per output channel."
            }
            Scheme::Fp8 { format: Fp8Format::E4M3, per_tensor: true } => {
                "OCP FP8 E4M3 (max 448) with a single f32 scale for the whole tensor."
            }
            Scheme::Fp8 { format: Fp8Format::E5M2, per_tensor: true } => {
                "OCP FP8 E5M2 (max 57344) with a single f32 scale for the whole tensor."
            }
            Scheme::Nf4 { .. } => {
                "QLoRA NormalFloat4: 16 normal-quantile levels scaled by an f32 absmax per block of 64 (4.5 bits/weight)."
            }
            Scheme::Ggml(GgmlType::Q8_0) => {
                "llama.cpp Q8_0: int8 with an FP16 scale per block of 32 (8.5 bits/weight)."
            }
            Scheme::Ggml(GgmlType::Q4_0) => {
                "llama.cpp Q4_0: 4-bit with an FP16 scale per block of 32 (4.5 bits/weight)."
            }
            Scheme::Ggml(GgmlType::Q4_1) => {
                "llama.cpp Q4_1: 4-bit with an FP16 scale and FP16 minimum per block of 32 (5 bits/weight)."
            }
            Scheme::Ggml(GgmlType::Q5_0) => {
                "llama.cpp Q5_0: 5-bit with an FP16 scale per block of 32 (5.5 bits/weight)."
            }
            Scheme::Ggml(GgmlType::Q4K) => {
                "llama.cpp Q4_K: 4-bit super-blocks of 256 with searched 6-bit sub-block scales and mins (4.5 bits/weight); rows that are not whole 256-blocks as Q5_0, as llama.cpp does."
            }
            Scheme::Ggml(GgmlType::Q6K) => {
                "llama.cpp Q6_K: 6-bit super-blocks of 256 with searched 8-bit sub-block scales (6.5625 bits/weight); rows that are not whole 256-blocks as Q8_0, as llama.cpp does."
            }
            Scheme::Ggml(GgmlType::Mxfp4) => {
                "OCP MXFP4 as in llama.cpp: E2M1 values with a power-of-two E8M0 scale per block of 32 (4.25 bits/weight)."
            }
            // Not in `Scheme::all()`: only a hand-built scheme can name one, and `quantize` refuses it.
            Scheme::Ggml(
                GgmlType::Q5_1
                | GgmlType::Q2K
                | GgmlType::Q3K
                | GgmlType::Q5K
                | GgmlType::Iq4Nl
                | GgmlType::Iq4Xs
                | GgmlType::Nvfp4,
            ) => "A llama.cpp block format qdrift reads from GGUF files but cannot quantize to.",
        }
    }

    /// Whether this scheme can quantize at all (every listed scheme can).
    ///
    /// # Errors
    /// [`QuantizeError::ZeroGroup`] when a hand-built scheme has a group or block size of zero,
    /// [`QuantizeError::Ggml`] ([`qdrift_ggml::GgmlError::NoQuantizer`]) when it names a
    /// read-only GGML type (no listed scheme does either).
    pub fn check_usable(&self) -> Result<(), QuantizeError> {
        match *self {
            Scheme::Int4 { group: 0, .. } | Scheme::Nf4 { block: 0 } => {
                Err(QuantizeError::ZeroGroup { scheme: self.to_string() })
            }
            Scheme::Ggml(ty) if !ty.has_quantizer() => Err(qdrift_ggml::GgmlError::NoQuantizer { ty }.into()),
            _ => Ok(()),
        }
    }

    fn known_names() -> String {
        Scheme::all().iter().map(Scheme::to_string).collect::<Vec<_>>().join(", ")
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scheme::Fp16 => f.write_str("fp16"),
            Scheme::Bf16 => f.write_str("bf16"),
            Scheme::Int8 => f.write_str("int8"),
            Scheme::Int4 { group, asym } => {
                write!(f, "int4-g{group}{}", if *asym { "-asym" } else { "" })
            }
            Scheme::Fp8 { format, per_tensor } => {
                write!(f, "fp8-{}{}", format.cli(), if *per_tensor { "-tensor" } else { "" })
            }
            Scheme::Nf4 { block } => write!(f, "nf4-g{block}"),
            Scheme::Ggml(ty) => f.write_str(ty.name()),
        }
    }
}

impl FromStr for Scheme {
    type Err = QuantizeError;

    /// Parses a CLI name (exactly as [`Scheme::all`] prints them).
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Scheme::all().into_iter().find(|scheme| scheme.to_string() == name).ok_or_else(|| {
            QuantizeError::UnknownScheme {
                name: name.to_owned(),
                hint: scheme_hint(name),
                known: Scheme::known_names(),
            }
        })
    }
}

/// What an unknown scheme name probably meant, after it in the error (` (did you mean
/// int4-g128?)`), or empty: llama.cpp's file types (`q4_k_m`) are explained, since they are
/// mixes of block formats and no single scheme; a name that differs from a known one by case,
/// `_` for `-`, or at most two edits gets that one.
pub(crate) fn scheme_hint(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    let known: Vec<String> = Scheme::all().iter().map(Scheme::to_string).collect();
    // llama.cpp's `LLAMA_FTYPE_MOSTLY_Qn_K_{S,M,L}`: a mix that keeps some tensors wider.
    if let Some(base) = lower.strip_suffix("_s").or(lower.strip_suffix("_m")).or(lower.strip_suffix("_l"))
        && base.len() == 4
        && base.starts_with('q')
        && base.ends_with("_k")
    {
        let upper = name.to_ascii_uppercase();
        let scheme = if known.iter().any(|k| k == base) {
            format!("the scheme {base} rounds every linear layer with {base}")
        } else {
            format!("qdrift has no {base} scheme")
        };
        return format!(
            " (llama.cpp's {upper} is a file type that mixes {base} with wider formats for some tensors, not one \
             scheme: {scheme}; to evaluate a {upper} file, pass it with --variant FILE)"
        );
    }
    let normalized = lower.replace('_', "-");
    let closest =
        known.iter().map(|k| (strsim::levenshtein(&normalized, k), k)).filter(|(d, _)| *d <= 2).min_by_key(|(d, _)| *d);
    closest.map_or_else(String::new, |(_, k)| format!(" (did you mean {k}?)"))
}
