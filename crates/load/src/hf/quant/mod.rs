//! Quantized Hugging Face folders: `quantization_config` in `config.json` (or AutoGPTQ's
//! `quantize_config.json`), each linear layer dequantized on load into [`crate::HostModel`]'s
//! f32 `[out, in]` layout. The reader ([`crate::read_hf_folder`]) permutes q/k rows to the
//! interleaved RoPE layout *after* dequantization, so the permutation moves real rows.
//!
//! Every layout stores integer codes `q` (or FP8 codes), scales `s` and, for asymmetric
//! formats, zero points `z`; qdrift computes `w = (q − z) · s` in f32. For F16/BF16 scales this
//! product is exact (an ≤ 9-bit integer times an 11-bit mantissa), so the weights are the exact
//! values the checkpoint encodes; PyTorch kernels that multiply in the scale's dtype round it
//! once more to F16/BF16. A linear layer the checkpoint leaves unquantized (`lm_head`,
//! `modules_to_not_convert`, compressed-tensors' `ignore`) is read as a plain F32/F16/BF16
//! `.weight`.
//!
//! Each layout's file holds its config (parsed from `quantization_config`, and written back for
//! fixtures), its unpacking (dequantization on load) and its packing (codes into the tensors a
//! checkpoint stores, used by `qdrift-quantize`'s fixture writer), and cites the sources of its
//! layout:
//!
//! | file | layout |
//! |---|---|
//! | `gptq.rs` | [`Gptq`]: `qweight`/`qzeros`/`scales`/`g_idx` (AutoGPTQ v1, GPTQModel v2) |
//! | `awq.rs` | [`Awq`]: AutoAWQ GEMM |
//! | `compressed.rs` | [`Compressed`]: compressed-tensors `pack-quantized`, `int-quantized`, `float-quantized`, and the FP4 formats of `fp4.rs` |
//! | `modelopt.rs` | [`ModelOpt`]: NVIDIA ModelOpt NVFP4 exports (`quant_method: modelopt`, `hf_quant_config.json`) |
//! | `fp4.rs` | compressed-tensors `nvfp4-pack-quantized` and `mxfp4-pack-quantized` ([`Fp4Codes`]); E2M1 nibble packing |
//! | `fp8.rs` | [`Fp8`]: `quant_method: fp8` (block or per-tensor scales) |
//! | `packing.rs` | what they share: bit fields, group indices, scale grids ([`Strategy`]); the codes a writer hands over ([`IntCodes`], [`Fp8Codes`]), the tensors it gets back ([`HfTensor`]) |
//! | `fields.rs` | reading `quantization_config` fields, with errors that name them |
//!
//! A new layout is a new file with the same four parts (parse the config, write it, unpack,
//! pack), a variant of `Method` below (parsed in `parse`, dispatched in `HfQuant::linear` and
//! `HfQuant::stores_quantized`), and, to write fixtures, an `HfLayout` variant in
//! `qdrift-quantize`'s `hf_packed.rs`.

mod awq;
mod compressed;
mod fields;
mod fp4;
mod fp8;
mod gptq;
mod modelopt;
mod packing;

use std::path::{Path, PathBuf};

use serde_json::Value;

pub use awq::Awq;
use compressed::ReadCompressed;
pub use compressed::{Compressed, CtActivations, CtFormat, CtGroup, CtScheme, CtWeights};
pub use fp4::{Fp4Codes, Fp4Kind};
pub use fp8::Fp8;
pub use gptq::Gptq;
pub use modelopt::ModelOpt;
pub use packing::{Fp8Codes, HfDtype, HfTensor, IntCodes, Strategy};

use crate::LoadError;
use crate::hf::shards::Shards;
use crate::loaded::{CheckpointActivations, CheckpointQuant};
use fields::Fields;
use qdrift_weights::HostTensor;

/// The quantization of a folder, parsed from its config.
#[derive(Debug, Clone)]
pub(crate) struct HfQuant {
    /// The file the configuration came from (`config.json` or `quantize_config.json`).
    path: PathBuf,
    method: Method,
    /// What [`crate::LoadedModel::quantization`] reports.
    pub(crate) summary: CheckpointQuant,
}

/// The layouts, each with its parsed config.
#[derive(Debug, Clone)]
enum Method {
    Gptq(Gptq),
    Awq(Awq),
    Compressed(ReadCompressed),
    Fp8(Fp8),
    ModelOpt(ModelOpt),
    /// `quant_method: mxfp4` (gpt-oss): only the experts' fused 3-D tensors are MXFP4
    /// (`*_blocks`, `*_scales`), read by the Hugging Face reader's gpt-oss expert path; every
    /// linear layer is a plain `.weight`.
    Mxfp4,
}

/// The folder's quantization: `config.json`'s `quantization_config`, else `quantize_config.json`
/// (AutoGPTQ), else `hf_quant_config.json` (ModelOpt); `None` for an unquantized folder.
pub(crate) fn read_quant_config(dir: &Path, config_path: &Path, config: &Value) -> Result<Option<HfQuant>, LoadError> {
    if let Some(q) = config.get("quantization_config").filter(|v| !v.is_null()) {
        if !q.is_object() {
            return Err(LoadError::invalid(config_path, "quantization_config is not an object"));
        }
        return parse(Fields { path: config_path, prefix: "quantization_config".into(), v: q }, None).map(Some);
    }
    let legacy = dir.join("quantize_config.json");
    if legacy.exists() {
        let v = crate::input::read_json(&legacy, crate::input::JSON)?;
        if !v.is_object() {
            return Err(LoadError::invalid(&legacy, "is not a JSON object"));
        }
        // AutoGPTQ's file has no quant_method: it is GPTQ.
        return parse(Fields { path: &legacy, prefix: String::new(), v: &v }, Some("gptq")).map(Some);
    }
    let modelopt = dir.join("hf_quant_config.json");
    if modelopt.exists() {
        let v = crate::input::read_json(&modelopt, crate::input::JSON)?;
        let Some(q) = v.get("quantization").filter(|q| q.is_object()) else {
            return Err(LoadError::invalid(&modelopt, "has no quantization object"));
        };
        // ModelOpt's file has no quant_method.
        return parse(Fields { path: &modelopt, prefix: "quantization".into(), v: q }, Some("modelopt")).map(Some);
    }
    Ok(None)
}

const METHODS: &str = "gptq, awq, compressed-tensors, fp8, modelopt (NVFP4), mxfp4 (gpt-oss experts)";

fn parse(f: Fields<'_>, default_method: Option<&str>) -> Result<HfQuant, LoadError> {
    let method = f.str("quant_method")?.or(default_method);
    let (method, weights, activations): (Method, String, Option<CheckpointActivations>) =
        match method.map(str::to_ascii_lowercase).as_deref() {
            Some("gptq") => {
                let g = Gptq::parse(&f)?;
                (Method::Gptq(g), g.summary(), None)
            }
            Some("awq") => {
                let a = Awq::parse(&f)?;
                (Method::Awq(a), a.summary(), None)
            }
            Some("compressed-tensors") => {
                let (c, name, activations) = Compressed::parse(&f)?;
                (Method::Compressed(c), name, activations)
            }
            Some("fp8") => {
                let (c, name, activations) = Fp8::parse(&f)?;
                (Method::Fp8(c), name, Some(activations))
            }
            Some("modelopt") => {
                let (m, name, activations) = ModelOpt::parse(&f)?;
                (Method::ModelOpt(m), name, activations)
            }
            Some("mxfp4") => (Method::Mxfp4, "mxfp4 (experts)".to_string(), None),
            _ => return Err(f.unsupported("quant_method", method.unwrap_or("(missing)"), METHODS)),
        };
    Ok(HfQuant {
        path: f.path.to_path_buf(),
        method,
        summary: CheckpointQuant { weights, activations, input_scales: None },
    })
}

impl HfQuant {
    /// The linear layer `module` (`model.layers.0.self_attn.q_proj`, `lm_head`) as f32
    /// `[out, in]`, in the checkpoint's row order; `None` when the folder has no such layer.
    ///
    /// # Shapes
    /// - returns `[out, inp]`.
    pub(crate) fn linear(
        &self,
        shards: &Shards,
        module: &str,
        out: usize,
        inp: usize,
    ) -> Result<Option<HostTensor>, LoadError> {
        if !self.stores_quantized(shards, module) {
            return shards.get(&format!("{module}.weight"), &[out, inp]);
        }
        let data = match &self.method {
            Method::Gptq(g) => g.unpack(shards, module, out, inp)?,
            Method::Awq(a) => a.unpack(shards, module, out, inp)?,
            Method::Compressed(c) => match c.scheme_of(module) {
                Some(s) => s.unpack(shards, module, out, inp)?,
                None => return shards.get(&format!("{module}.weight"), &[out, inp]),
            },
            Method::Fp8(f) => f.unpack(shards, module, out, inp)?,
            Method::ModelOpt(m) => m.unpack(shards, module, [out, inp], self.summary.activations.is_some())?,
            Method::Mxfp4 => return shards.get(&format!("{module}.weight"), &[out, inp]),
        };
        let name = format!("{module}.weight");
        let path = shards.path_of(&name).unwrap_or(self.path.as_path());
        crate::input::check_finite(path, &name, &data)?;
        HostTensor::new(vec![out, inp], data)
            .map(Some)
            .ok_or_else(|| LoadError::invalid(&self.path, format!("{module}: dequantized size does not match")))
    }

    /// Whether the folder stores linear layer `module` quantized: GPTQ/AWQ when it has a
    /// `qweight`, compressed-tensors when a config group targets it and `ignore` does not, FP8
    /// when its `weight` is FP8, ModelOpt when it is U8 (quantizers skip some layers: `lm_head`,
    /// `modules_to_not_convert`, `exclude_modules`).
    pub(crate) fn stores_quantized(&self, shards: &Shards, module: &str) -> bool {
        match &self.method {
            Method::Gptq(_) | Method::Awq(_) => shards.has(&format!("{module}.qweight")),
            Method::Compressed(c) => c.scheme_of(module).is_some(),
            Method::Fp8(_) => Fp8::stores_quantized(shards, module),
            Method::ModelOpt(_) => ModelOpt::stores_quantized(shards, module),
            Method::Mxfp4 => false,
        }
    }

    /// Whether this is gpt-oss's MXFP4 (experts only).
    pub(crate) fn is_mxfp4(&self) -> bool {
        matches!(self.method, Method::Mxfp4)
    }

    /// The summary with, for NVFP4 activations (W4A4), the stored static global input scales of
    /// the model's `n_layers` layers ([`CheckpointQuant::input_scales`]).
    pub(crate) fn summary_with_scales(&self, shards: &Shards, n_layers: usize) -> Result<CheckpointQuant, LoadError> {
        let mut summary = self.summary.clone();
        if summary.activations.is_some_and(|a| a.format == crate::loaded::ActivationFormat::Nvfp4) {
            summary.input_scales =
                Some((0..n_layers).map(|i| self.layer_input_scales(shards, i)).collect::<Result<_, _>>()?);
        }
        Ok(summary)
    }

    /// Layer `i`'s global input scale per input site (q/k/v, o, gate/up, down), each the
    /// combination of the stored scales of the linear layers reading that input, as vLLM fuses
    /// them (v0.11 `compressed_tensors_w4a4_nvfp4.py` `CompressedTensorsW4A4Fp4.
    /// process_weights_after_loading`: `input_global_scale.max()` over the fused shards;
    /// `modelopt.py` `ModelOptNvFp4LinearMethod.process_weights_after_loading`:
    /// `input_scale.max()`, i.e. the smallest global scale `1/input_scale`). compressed-tensors
    /// stores `input_global_scale` = 448·6/amax (the divisor of the input; an F32 `[1]` that
    /// 0.20.1's `quantization/lifecycle/initialize.py` registers for `tensor_group` activations,
    /// `quantization/utils/helpers.py` `generate_gparam` computes); ModelOpt stores
    /// `input_scale` = amax/(6·448), so its global scale is `1/input_scale`. Dense layers only:
    /// a missing tensor (a mixture-of-experts layer, another naming) is refused by name, as is a
    /// zero, negative, infinite or NaN scale.
    fn layer_input_scales(&self, shards: &Shards, i: usize) -> Result<[f32; 4], LoadError> {
        const SITES: [&[&str]; 4] = [
            &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
            &["self_attn.o_proj"],
            &["mlp.gate_proj", "mlp.up_proj"],
            &["mlp.down_proj"],
        ];
        let (tensor, modelopt) = match &self.method {
            Method::ModelOpt(_) => ("input_scale", true),
            _ => ("input_global_scale", false),
        };
        let mut out = [0.0f32; 4];
        for (slot, modules) in out.iter_mut().zip(SITES) {
            let mut stored = 0.0f32;
            for m in modules {
                let name = format!("model.layers.{i}.{m}.{tensor}");
                if !shards.has(&name) {
                    return Err(LoadError::invalid(
                        &self.path,
                        format!(
                            "tensor {name} is missing: NVFP4 activations (W4A4) need every linear layer's static \
                             input scale (qdrift reads them for dense q/k/v/o/gate/up/down layers)"
                        ),
                    ));
                }
                let x = fp4::positive_scalar(shards, &name, false)?;
                if !x.is_finite() {
                    let path = shards.path_of(&name).unwrap_or(self.path.as_path());
                    return Err(LoadError::invalid(path, format!("tensor {name} = {x}: a scale must be finite")));
                }
                stored = stored.max(x);
            }
            *slot = if modelopt { 1.0 / stored } else { stored };
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses a written `quantization_config`.
    fn reparse(text: &str) -> Method {
        let v: Value = serde_json::from_str(text).expect("JSON");
        let f = Fields { path: Path::new("config.json"), prefix: "quantization_config".into(), v: &v };
        parse(f, None).expect("parses").method
    }

    #[test]
    fn written_configs_parse_back_to_themselves() {
        for g in [
            Gptq { bits: 4, group: Some(128), desc_act: true, sym: false, v2: false },
            Gptq { bits: 8, group: None, desc_act: false, sym: true, v2: true },
        ] {
            assert!(matches!(reparse(&g.quantization_config()), Method::Gptq(x) if x == g));
        }
        let m = ModelOpt { group: 16 };
        assert!(matches!(reparse(&m.quantization_config()), Method::ModelOpt(x) if x == m));
        let v: Value = serde_json::from_str(&m.hf_quant_config()).expect("JSON");
        let f =
            Fields { path: Path::new("hf_quant_config.json"), prefix: "quantization".into(), v: &v["quantization"] };
        assert!(matches!(parse(f, Some("modelopt")).expect("parses").method, Method::ModelOpt(x) if x == m));
        for a in [Awq { group: Some(32) }, Awq { group: None }] {
            assert!(matches!(reparse(&a.quantization_config()), Method::Awq(x) if x == a));
        }
        for f in [
            Fp8 { fmt: crate::ofp8::Ofp8::E4M3, block: Some((128, 64)) },
            Fp8 { fmt: crate::ofp8::Ofp8::E5M2, block: None },
        ] {
            assert!(matches!(reparse(&f.quantization_config()), Method::Fp8(x) if x == f));
        }
        let scheme = |format, bits, float, strategy, activations| CtScheme {
            format,
            weights: CtWeights { bits, float, symmetric: true, strategy },
            activations,
        };
        // Every group declares the same activations (the reader refuses mixed ones).
        let acts = Some(CtActivations {
            bits: 8,
            float: true,
            granularity: crate::loaded::ActivationGranularity::TokenGroup(128),
        });
        let c = Compressed {
            groups: vec![
                CtGroup {
                    targets: vec!["re:.*mlp.*".into()],
                    scheme: scheme(CtFormat::Packed, 4, false, Strategy::Group(64), acts),
                },
                CtGroup {
                    targets: vec!["Linear".into()],
                    scheme: scheme(CtFormat::Float, 8, true, Strategy::Block(128, 128), acts),
                },
            ],
            ignore: vec!["lm_head".into()],
        };
        assert!(matches!(reparse(&c.quantization_config()), Method::Compressed(x) if x.config == c));
        // W4A4: compressed-tensors' NVFP4 and MXFP4 presets' FP4 activations.
        for (format, g) in [(CtFormat::Nvfp4, 16), (CtFormat::Mxfp4, 32)] {
            let acts = CtActivations {
                bits: 4,
                float: true,
                granularity: crate::loaded::ActivationGranularity::TokenGroup(g),
            };
            let c = Compressed {
                groups: vec![CtGroup {
                    targets: vec!["Linear".into()],
                    scheme: scheme(format, 4, true, Strategy::Group(g), Some(acts)),
                }],
                ignore: vec![],
            };
            assert!(matches!(reparse(&c.quantization_config()), Method::Compressed(x) if x.config == c));
        }
    }
}
