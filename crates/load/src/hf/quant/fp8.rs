//! **FP8** (`quant_method: fp8`, `fmt: e4m3`, `weight_block_size: [128, 128]`,
//! `activation_scheme: dynamic`; DeepSeek-V3, Qwen3-FP8): the config, unpacking on load and
//! packing for fixtures, side by side.
//!
//! Following `transformers` `integrations/finegrained_fp8.py` (`FP8Linear`) and DeepSeek-V3's
//! `inference/kernel.py` `weight_dequant`: `weight` F8_E4M3/F8_E5M2 `[out, in]`,
//! `weight_scale_inv` F32 `[⌈out/bh⌉, ⌈in/bw⌉]` for blocks (or `[1]` per tensor, `[out]`/`[out, 1]`
//! per channel), `w = fp8 · scale_inv[block]`. FP8 values decode with [`crate::ofp8`] (OCP OFP8
//! v1.0). `activation_scheme: dynamic` is FP8 E4M3 activations, per tensor (vLLM's
//! `Fp8LinearMethod`), or per token and group of `bw` inputs with blocks
//! ([`ActivationGranularity::TokenGroup`]); `static` (stored `input_scale`s) is refused, and so is
//! DeepSeek-V3.1's `scale_fmt: ue8m0` (power-of-two activation scales).

use safetensors::Dtype;
use serde_json::{Value, json};

use super::fields::Fields;
use super::packing::{Fp8Codes, HfDtype, HfTensor, Strategy};
use crate::LoadError;
use crate::hf::shards::Shards;
use crate::loaded::{ActivationFormat, ActivationGranularity, CheckpointActivations};
use crate::ofp8::Ofp8;

/// A `quant_method: fp8` `quantization_config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8 {
    /// `fmt`: the declared FP8 format (the stored dtype decides how codes decode).
    pub fmt: Ofp8,
    /// `weight_block_size` `[rows, cols]`; `None` for one scale per tensor (or per channel, as
    /// the scale's shape says).
    pub block: Option<(usize, usize)>,
}

impl Fp8 {
    /// Parses the config (see the module doc); returns it with the format's name in reports
    /// (`fp8 e4m3 block 128x128`) and the declared activations.
    pub(crate) fn parse(f: &Fields<'_>) -> Result<(Self, String, CheckpointActivations), LoadError> {
        let fmt = f.str("fmt")?.unwrap_or("e4m3");
        let format = match fmt {
            "e4m3" => Ofp8::E4M3,
            "e5m2" => Ofp8::E5M2,
            _ => return Err(f.unsupported("fmt", fmt, "e4m3, e5m2")),
        };
        let block = match f.get("weight_block_size") {
            None => None,
            Some(v) => {
                let dims: Option<Vec<usize>> = v
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_u64).filter_map(|d| usize::try_from(d).ok()).collect());
                match dims.as_deref() {
                    Some(&[r, c]) if r > 0 && c > 0 => Some((r, c)),
                    _ => {
                        return Err(f.unsupported(
                            "weight_block_size",
                            v,
                            "[rows, cols] of positive integers, or null",
                        ));
                    }
                }
            }
        };
        check_activations(f)?;
        let granularity = match block {
            Some((_, c)) => ActivationGranularity::TokenGroup(c),
            None => ActivationGranularity::Tensor,
        };
        let activations = CheckpointActivations { format: ActivationFormat::Fp8E4M3, granularity };
        let name = match block {
            Some((r, c)) => format!("fp8 {fmt} block {r}x{c}"),
            None => format!("fp8 {fmt}"),
        };
        Ok((Fp8 { fmt: format, block }, name, activations))
    }

    /// `config.json`'s `quantization_config` for this config, as JSON text (dynamic activations).
    pub fn quantization_config(&self) -> String {
        json!({
            "quant_method": "fp8",
            "fmt": match self.fmt {
                Ofp8::E4M3 => "e4m3",
                Ofp8::E5M2 => "e5m2",
            },
            "activation_scheme": "dynamic",
            "weight_block_size": self.block.map_or(Value::Null, |(r, c)| json!([r, c])),
        })
        .to_string()
    }

    /// Whether the folder stores linear layer `module` in FP8 (its `weight` has an FP8 dtype;
    /// quantizers leave some layers, such as `lm_head`, unquantized).
    pub(crate) fn stores_quantized(shards: &Shards, module: &str) -> bool {
        shards.dtype(&format!("{module}.weight")).is_some_and(|d| matches!(d, Dtype::F8_E4M3 | Dtype::F8_E5M2))
    }

    /// The scale grid of `module`: the blocks, else per channel when the stored scale has one
    /// value per row, else per tensor.
    fn strategy(&self, shards: &Shards, scale_name: &str, out: usize) -> Strategy {
        match self.block {
            Some((r, c)) => Strategy::Block(r, c),
            None => {
                let n = shards.shape(scale_name).map_or(1, |s| s.iter().product());
                if n == out && out != 1 { Strategy::Channel } else { Strategy::Tensor }
            }
        }
    }

    /// Dequantizes linear layer `module` (see the module doc).
    ///
    /// # Shapes
    /// - `weight`: `[out, inp]` FP8; `weight_scale_inv`: `[⌈out/bh⌉, ⌈inp/bw⌉]`, `[out]`/`[out, 1]`
    ///   or `[1]`; returns `[out, inp]`.
    pub(crate) fn unpack(&self, shards: &Shards, module: &str, out: usize, inp: usize) -> Result<Vec<f32>, LoadError> {
        let scale_name = format!("{module}.weight_scale_inv");
        let strategy = self.strategy(shards, &scale_name, out);
        let scales = shards.floats_any(&scale_name, &strategy.scale_shapes(out, inp))?;
        let (_, cols) = strategy.grid(out, inp);
        let (format, bytes) = shards.fp8(&format!("{module}.weight"), &[out, inp])?;
        Ok((0..out * inp)
            .map(|k| format.decode(bytes[k]) * scales[strategy.index(k / inp, k % inp, cols, None)])
            .collect())
    }

    /// Packs the FP8 codes of linear layer `module` as `weight` and `weight_scale_inv` (see the
    /// module doc): the scales on the blocks' grid, or one scale for the tensor without blocks.
    ///
    /// # Shapes
    /// - `codes`: `[out, inp]` codes, scales `[⌈out/bh⌉, ⌈inp/bw⌉]` (blocks) or `[1]`; returns
    ///   `weight` `[out, inp]`, `weight_scale_inv` `[⌈out/bh⌉, ⌈inp/bw⌉]` or `[1]`.
    pub fn pack(&self, module: &str, codes: &Fp8Codes<'_>) -> Vec<HfTensor> {
        let shape = match self.block {
            Some((r, c)) => {
                let (rows, cols) = Strategy::Block(r, c).grid(codes.out, codes.inp);
                vec![rows, cols]
            }
            None => vec![1],
        };
        let scale = HfTensor::floats(format!("{module}.weight_scale_inv"), HfDtype::F32, shape, codes.scales);
        vec![codes.weight(module), scale]
    }
}

/// Refuses static activation scales and power-of-two ones.
fn check_activations(f: &Fields<'_>) -> Result<(), LoadError> {
    let scheme = f.str("activation_scheme")?.unwrap_or("dynamic");
    if scheme != "dynamic" {
        return Err(f.unsupported(
            "activation_scheme",
            scheme,
            "dynamic (qdrift computes activation scales at run time; stored input_scale values are not reproduced)",
        ));
    }
    // DeepSeek-V3.1's `scale_fmt: ue8m0` asks for power-of-two activation scales (vLLM's
    // `use_ue8m0`, DeepSeek's `act_quant(.., scale_fmt)`), which qdrift does not round.
    match f.get("scale_fmt") {
        None | Some(Value::Null) => Ok(()),
        Some(v) => Err(f.unsupported(
            "scale_fmt",
            v,
            "absent or null (activation scales amax/448; power-of-two ue8m0 scales are not modelled)",
        )),
    }
}
