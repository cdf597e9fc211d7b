//! The weight formats, one file each, and their registry: [`FORMATS`], from which every method
//! of [`Scheme`] (its name, `describe`, checks, storage bytes, and [`Scheme::all`]'s order)
//! and [`crate::quantize`] take the format's own answer.
//!
//! | file | format | schemes |
//! |---|---|---|
//! | `float.rs` | IEEE binary16 and bfloat16 | `fp16`, `bf16` |
//! | `int.rs` | affine integers | `int8`, `int4-g*`, `int4-g*-asym` |
//! | `fp8.rs` | OCP FP8, with the OFP8 codec | `fp8-e4m3`, `fp8-e5m2` (+ `-tensor`) |
//! | `nf4.rs` | QLoRA NormalFloat4 | `nf4-g64` |
//! | `ggml.rs` | ggml's block formats (codecs in `qdrift-ggml`) | `q8_0`, `q4_0`, `q4_1`, `q5_0`, `q4_k`, `q6_k`, `mxfp4` |
//! | `mxfp4.rs` | OCP MXFP4 by the spec's and compressed-tensors' scale rules | `mxfp4-ocp`, `mxfp4-ct` |
//! | `nvfp4.rs` | NVFP4 as compressed-tensors quantizes it | `nvfp4` |
//!
//! Adding a format: see the crate doc (`lib.rs`), "Adding a format".

use std::fmt;
use std::str::FromStr;

use crate::error::QuantizeError;
use crate::format::Format;
use crate::scheme::Scheme;

pub(crate) mod float;
pub(crate) mod fp8;
pub(crate) mod ggml;
pub(crate) mod int;
pub(crate) mod mxfp4;
pub(crate) mod nf4;
pub(crate) mod nvfp4;

/// Every format, in the order `--help` lists their schemes.
pub(crate) static FORMATS: &[&dyn Format] =
    &[&float::Float, &int::Int, &fp8::Fp8, &nf4::Nf4, &ggml::Ggml, &mxfp4::Mxfp4, &nvfp4::Nvfp4];

impl Scheme {
    /// The registered format that owns this scheme.
    pub(crate) fn format(&self) -> &'static dyn Format {
        // Exactly one format owns each variant (`every_variant_has_one_format` below).
        FORMATS.iter().copied().find(|format| format.owns(self)).expect("every Scheme variant has a registered format")
    }

    /// Every scheme with a CLI name, in the order `--help` lists them.
    pub fn all() -> Vec<Scheme> {
        FORMATS.iter().flat_map(|format| format.listed()).collect()
    }

    /// One sentence for `--help`.
    pub fn describe(&self) -> &'static str {
        self.format().describe(self)
    }

    /// Whether this scheme can quantize at all (every listed scheme can).
    ///
    /// # Errors
    /// [`QuantizeError::ZeroGroup`] when a hand-built scheme has a group or block size of zero,
    /// [`QuantizeError::Ggml`] ([`qdrift_ggml::GgmlError::NoQuantizer`]) when it names a
    /// read-only GGML type (no listed scheme does either).
    pub fn check_usable(&self) -> Result<(), QuantizeError> {
        self.format().check_usable(self)
    }

    /// Bytes this scheme stores for a `[rows, cols]` matrix (codes, scales, zero points, blocks):
    /// exactly [`crate::QuantizedMatrix::storage_bytes`] of any such matrix quantized with it.
    /// `qdrift-quantize`'s `tests/footprint.rs` checks every scheme's formula against its codec.
    ///
    /// # Errors
    /// [`QuantizeError::ZeroGroup`] for a hand-built scheme with a group or block size of zero,
    /// [`QuantizeError::Ggml`] for one naming a read-only GGML type, as [`crate::quantize`]
    /// refuses them.
    pub fn storage_bytes(&self, rows: u64, cols: u64) -> Result<u64, QuantizeError> {
        self.check_usable()?;
        Ok(self.format().storage_bytes(self, rows, cols))
    }

    /// Whether a GGUF file can hold this scheme's matrices as quantized: `fp16` and the ggml
    /// schemes ([`crate::QuantizedMatrix::stored`] is then `Some`).
    pub fn gguf_storable(&self) -> bool {
        self.format().gguf_storable(self)
    }

    fn known_names() -> String {
        Scheme::all().iter().map(Scheme::to_string).collect::<Vec<_>>().join(", ")
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.format().name(self))
    }
}

impl FromStr for Scheme {
    type Err = QuantizeError;

    /// Parses a CLI name (exactly as [`Scheme::all`] prints them).
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        FORMATS.iter().find_map(|format| format.parse(name)).ok_or_else(|| QuantizeError::UnknownScheme {
            name: name.to_owned(),
            hint: scheme_hint(name),
            known: Scheme::known_names(),
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

#[cfg(test)]
mod tests {
    use super::FORMATS;
    use crate::{Fp8Format, GgmlType, Scheme};

    /// One scheme of every variant, listed or hand-built (read-only ggml types included). The
    /// match below has no wildcard: a new `Scheme` variant does not compile until it is named
    /// here, with a sample pushed here if `Scheme::all` does not list one, and then
    /// `every_variant_has_one_format` checks that a registered format owns it.
    fn every_variant() -> Vec<Scheme> {
        for scheme in Scheme::all() {
            match scheme {
                Scheme::Fp16
                | Scheme::Bf16
                | Scheme::Int8
                | Scheme::Int4 { .. }
                | Scheme::Fp8 { .. }
                | Scheme::Nf4 { .. }
                | Scheme::Ggml(_)
                | Scheme::Mxfp4 { .. }
                | Scheme::Nvfp4 => {}
            }
        }
        let mut all = Scheme::all();
        all.extend([
            Scheme::Int4 { group: 0, asym: true },
            Scheme::Int4 { group: 7, asym: false },
            Scheme::Fp8 { format: Fp8Format::E5M2, per_tensor: true },
            Scheme::Nf4 { block: 0 },
            Scheme::Nf4 { block: 32 },
        ]);
        all.extend(GgmlType::READABLE.map(Scheme::Ggml));
        all
    }

    #[test]
    fn every_variant_has_one_format() {
        for scheme in every_variant() {
            let owners = FORMATS.iter().filter(|f| f.owns(&scheme)).count();
            assert_eq!(owners, 1, "{scheme:?}");
        }
    }

    #[test]
    fn listed_schemes_belong_to_their_lister_and_round_trip() {
        for format in FORMATS {
            for scheme in format.listed() {
                assert!(format.owns(&scheme), "{scheme:?}");
                assert_eq!(scheme.to_string().parse::<Scheme>(), Ok(scheme));
                assert!(scheme.check_usable().is_ok(), "{scheme}");
            }
        }
    }
}
