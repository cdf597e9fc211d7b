//! **NVIDIA ModelOpt NVFP4** exports (`quant_method: modelopt` in `config.json`, or only
//! `hf_quant_config.json` in older exports): the config, unpacking on load and packing for
//! fixtures, side by side.
//!
//! Following nvidia-modelopt 0.47.0 `modelopt/torch/export/unified_export_hf.py` (writes
//! `hf_quant_config.json` `{"quantization": {"quant_algo", "group_size", "exclude_modules",
//! "kv_cache_quant_algo"}}` and embeds it in `config.json` through
//! `convert_hf_config.py` `convert_hf_quant_config_format`: `quant_method: modelopt`,
//! `quant_algo`, `config_groups`, `ignore`), `quant_utils.py` (the tensor names) and
//! `modelopt/torch/quantization/qtensor/nvfp4_tensor.py` (`NVFP4QTensor.quantize`,
//! `dequantize`): a quantized linear layer stores `weight` U8 `[out, in/2]` (two E2M1 codes per
//! byte, the even element in the low nibble, as `fp4.rs`), `weight_scale` F8_E4M3 `[out, in/16]`
//! and `weight_scale_2` F32 (0-d) = amax/(6·448); `w = e2m1(q) · (s · s2)`
//! ([`qdrift_ggml::GlobalScale::Multiply`]), code 8 decoding as +0 as ModelOpt's table has it
//! (compressed-tensors gives −0). ModelOpt writes `weight_scale_2 = 0` for an all-zero
//! weight (its block scales then become 1), so zero is accepted.
//!
//! `quant_algo: W4A16_NVFP4` (weight-only) is read, and `NVFP4` (W4A4): activations rounded to
//! NVFP4 too, under a static per-layer `input_scale` F32 (0-d) that ModelOpt stores as
//! amax/(6·448), the *inverse* of compressed-tensors' `input_global_scale` (448·6/amax):
//! `mod.rs` reads it as the global scale `1/input_scale`. `NVFP4_AWQ` (pre-quant scales),
//! `NVFP4_SVD` and `W4A8_NVFP4_FP8` are refused by name, as is an `input_scale` in a weight-only
//! folder and a KV-cache scheme. A layer is quantized when its `weight` is U8.

use safetensors::Dtype;
use serde_json::{Value, json};

use super::fields::Fields;
use super::fp4::{self, Fp4Codes};
use super::packing::{HfDtype, HfTensor};
use crate::LoadError;
use crate::hf::shards::Shards;
use crate::loaded::{ActivationFormat, ActivationGranularity, CheckpointActivations};
use qdrift_ggml::GlobalScale;

/// A ModelOpt NVFP4 export's weight quantization (its activations, for `quant_algo: NVFP4`, are
/// in [`crate::CheckpointQuant`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelOpt {
    /// `group_size`: weights per E4M3 scale (16).
    pub group: usize,
}

/// The `quant_algo` values qdrift reads.
const ALGOS: &str = "W4A16_NVFP4 (weight-only NVFP4), NVFP4 (W4A4)";

impl ModelOpt {
    /// Parses `config.json`'s `quantization_config` (`quant_method: modelopt`) or
    /// `hf_quant_config.json`'s `quantization`; returns it with the format's name in reports and
    /// its activations (NVFP4 per 16 for `quant_algo: NVFP4`).
    pub(crate) fn parse(f: &Fields<'_>) -> Result<(Self, String, Option<CheckpointActivations>), LoadError> {
        let algo = f.str("quant_algo")?.unwrap_or("(missing)");
        let activations = match algo {
            "W4A16_NVFP4" => None,
            "NVFP4" => Some(CheckpointActivations {
                format: ActivationFormat::Nvfp4,
                granularity: ActivationGranularity::TokenGroup(16),
            }),
            "NVFP4_AWQ" | "NVFP4_SVD" | "W4A8_NVFP4_FP8" => {
                return Err(f.unsupported(
                    "quant_algo",
                    algo,
                    &format!(
                        "{ALGOS}; {algo} also quantizes activations (static input_scale, W4A4/W4A8) in a form \
                         qdrift does not round, and would otherwise evaluate as weight-only"
                    ),
                ));
            }
            _ => return Err(f.unsupported("quant_algo", algo, ALGOS)),
        };
        for key in ["kv_cache_quant_algo", "kv_cache_scheme"] {
            if let Some(v) = f.get(key).filter(|v| !v.is_null()) {
                return Err(f.unsupported(key, v, "null (stored KV-cache scales are not reproduced)"));
            }
        }
        // `hf_quant_config.json` has `group_size`; config.json has it in its group's `weights`.
        let group = match f.group_size("group_size")? {
            Some(g) => Some(g),
            None => match f.get("config_groups").and_then(Value::as_object).and_then(|g| g.iter().next()) {
                Some((name, g)) => {
                    let g = Fields { path: f.path, prefix: f.field(&format!("config_groups.{name}")), v: g };
                    g.child("weights").map(|w| w.group_size("group_size")).transpose()?.flatten()
                }
                None => None,
            },
        };
        let kind = if activations.is_some() { "W4A4" } else { "W4A16" };
        match group.unwrap_or(16) {
            16 => Ok((ModelOpt { group: 16 }, format!("modelopt nvfp4 ({kind}) group 16"), activations)),
            g => Err(f.unsupported("group_size", g, "16 (NVFP4)")),
        }
    }

    /// Whether the folder stores linear layer `module` in NVFP4 (its `weight` is U8; ModelOpt
    /// leaves `exclude_modules` such as `lm_head` in the model's dtype).
    pub(crate) fn stores_quantized(shards: &Shards, module: &str) -> bool {
        shards.dtype(&format!("{module}.weight")) == Some(Dtype::U8)
    }

    /// Dequantizes linear layer `module` (see the module doc); `w4a4`: the config declares
    /// NVFP4 activations, so the layer's `input_scale` is expected (read by `mod.rs`).
    ///
    /// # Shapes
    /// - `weight`: `[out, inp/2]` U8; `weight_scale`: `[out, inp/16]`; `weight_scale_2`: `[]` or
    ///   `[1]`; returns `[out, inp]`.
    pub(crate) fn unpack(
        &self,
        shards: &Shards,
        module: &str,
        [out, inp]: [usize; 2],
        w4a4: bool,
    ) -> Result<Vec<f32>, LoadError> {
        let weight = format!("{module}.weight");
        let input_scale = format!("{module}.input_scale");
        if !w4a4 && shards.has(&input_scale) {
            return Err(LoadError::invalid(
                shards.path_of(&input_scale).unwrap_or(std::path::Path::new(".")),
                format!(
                    "tensor {input_scale}: the layer quantizes its activations (W4A4), but quant_algo \
                     W4A16_NVFP4 declares weight-only; a W4A4 export declares quant_algo NVFP4"
                ),
            ));
        }
        fp4::check_groups(shards, &weight, inp, self.group)?;
        let scales =
            fp4::scale_bytes(shards, &format!("{module}.weight_scale"), &[out, inp / self.group], Dtype::F8_E4M3)?;
        let s2 = fp4::positive_scalar(shards, &format!("{module}.weight_scale_2"), true)?;
        let mut codes = fp4::unpack_codes(shards, &weight, out, inp)?;
        // ModelOpt's `e2m1_values` decodes code 8 (−0) as +0.
        codes.iter_mut().filter(|q| **q == 8).for_each(|q| *q = 0);
        Ok(fp4::dequantize_nvfp4(&codes, &scales, GlobalScale::Multiply(s2)))
    }

    /// Packs NVFP4 codes of linear layer `module` as ModelOpt exports them: `weight` U8,
    /// `weight_scale` F8_E4M3 and `weight_scale_2` F32 0-d (`codes.global`, 1 when absent).
    ///
    /// # Shapes
    /// - `codes`: as [`Fp4Codes`] says; returns `weight` `[out, inp/2]`, `weight_scale`
    ///   `[out, inp/16]`, `weight_scale_2` `[]`.
    pub fn pack(&self, module: &str, codes: &Fp4Codes<'_>) -> Vec<HfTensor> {
        let s2 = codes.global.unwrap_or(1.0);
        vec![
            codes.packed(module, "weight"),
            codes.scale(module, HfDtype::F8E4M3, self.group),
            HfTensor::floats(format!("{module}.weight_scale_2"), HfDtype::F32, vec![], &[s2]),
        ]
    }

    /// `hf_quant_config.json` for this config, as JSON text.
    pub fn hf_quant_config(&self) -> String {
        json!({
            "producer": {"name": "modelopt", "version": "0.47.0"},
            "quantization": {
                "quant_algo": "W4A16_NVFP4",
                "group_size": self.group,
                "exclude_modules": ["lm_head"],
                "kv_cache_quant_algo": null,
            },
        })
        .to_string()
    }

    /// `config.json`'s `quantization_config` for this config, as JSON text (what
    /// `convert_hf_quant_config_format` makes of [`ModelOpt::hf_quant_config`]).
    pub fn quantization_config(&self) -> String {
        json!({
            "config_groups": {"group_0": {
                "weights": {"dynamic": false, "num_bits": 4, "type": "float", "group_size": self.group},
                "targets": ["Linear"],
            }},
            "ignore": ["lm_head"],
            "quant_algo": "W4A16_NVFP4",
            "producer": {"name": "modelopt", "version": "0.47.0"},
            "quant_method": "modelopt",
        })
        .to_string()
    }
}
