//! **GPTQ** (`quant_method: gptq`; bits 4 or 8, `group_size` G or −1, `desc_act`, `sym`): the
//! config, unpacking on load and packing for fixtures, side by side.
//!
//! Following AutoGPTQ `auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py` `QuantLinear.pack` and
//! its `forward` dequantization, and GPTQModel `gptqmodel/nn_modules/qlinear/__init__.py`
//! (`PackableQuantLinear.pack` / `dequantize_weight`); `transformers` docs
//! `docs/source/en/quantization/gptq.md`. With `pf = 32 / bits`:
//! - `qweight` I32 `[in / pf, out]`: input `i` of output `o` is bits `bits·(i mod pf)` up of
//!   `qweight[i / pf, o]` (low bits first), an unsigned code;
//! - `qzeros` I32 `[groups, out / pf]`: zero point of output `o` in group `g` is bits
//!   `bits·(o mod pf)` up of `qzeros[g, o / pf]`;
//! - `scales` F16 `[groups, out]`; `g_idx` I32 `[in]` (the group of each input; act-order
//!   `desc_act` checkpoints permute it; absent means `i / G`).
//! - `checkpoint_format: gptq` (v1, AutoGPTQ; the default) stores `z − 1`, so the reader adds 1
//!   to the unpacked field and masks to `bits` bits again (AutoGPTQ's `zeros = zeros + 1;
//!   zeros = bitwise_and(zeros, 2^bits − 1)`: a stored 15 is zero point 0); `gptq_v2`
//!   (GPTQModel) stores `z`. `w[o, i] = (q − z[g_idx[i], o]) · s[g_idx[i], o]`.
//!
//! `sym` and `desc_act` change how codes were chosen, not how they are stored: `g_idx` and the
//! stored zero points carry both.

use serde_json::json;

use super::fields::Fields;
use super::packing::{HfTensor, IntCodes, check_divides, field, group_index, group_name, put};
use crate::LoadError;
use crate::hf::shards::Shards;

/// A GPTQ `quantization_config` (or AutoGPTQ's `quantize_config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gptq {
    /// Bits per code: 4 or 8.
    pub bits: u32,
    /// Inputs per group; `None` for one group per row (`group_size: -1`).
    pub group: Option<usize>,
    /// `desc_act`: act-order groups, recorded in `g_idx`.
    pub desc_act: bool,
    /// `sym`: symmetric codes.
    pub sym: bool,
    /// `checkpoint_format: gptq_v2` (GPTQModel: zero points as they are); else v1 (AutoGPTQ:
    /// `z − 1`).
    pub v2: bool,
}

impl Gptq {
    /// Parses the config (see the module doc).
    pub(crate) fn parse(f: &Fields<'_>) -> Result<Self, LoadError> {
        let bits = match f.int("bits")? {
            Some(b @ (4 | 8)) => b as u32,
            other => return Err(f.unsupported("bits", other.map_or("(missing)".into(), |b| b.to_string()), "4, 8")),
        };
        let group = f.group_size("group_size")?;
        let sym = f.flag("sym", true)?;
        let desc_act = f.flag("desc_act", false)?;
        let format_key = if f.get("checkpoint_format").is_some() { "checkpoint_format" } else { "format" };
        let v2 = match f.str(format_key)? {
            None | Some("gptq") => false,
            Some("gptq_v2") => true,
            Some(other) => return Err(f.unsupported(format_key, other, "gptq (v1), gptq_v2")),
        };
        Ok(Gptq { bits, group, desc_act, sym, v2 })
    }

    /// The format's name in reports: `gptq 4-bit g128 v1`.
    pub(crate) fn summary(&self) -> String {
        format!("gptq {}-bit {} {}", self.bits, group_name(self.group), if self.v2 { "v2" } else { "v1" })
    }

    /// `config.json`'s `quantization_config` for this config, as JSON text.
    pub fn quantization_config(&self) -> String {
        json!({
            "quant_method": "gptq",
            "bits": self.bits,
            "group_size": self.group.map_or(-1, |g| g as i64),
            "desc_act": self.desc_act,
            "sym": self.sym,
            "checkpoint_format": if self.v2 { "gptq_v2" } else { "gptq" },
        })
        .to_string()
    }

    /// Dequantizes linear layer `module`.
    ///
    /// # Shapes
    /// - `qweight`: `[inp / pf, out]`, `qzeros`: `[groups, out / pf]`, `scales`: `[groups, out]`,
    ///   `g_idx`: `[inp]`; returns `[out, inp]`.
    pub(crate) fn unpack(&self, shards: &Shards, module: &str, out: usize, inp: usize) -> Result<Vec<f32>, LoadError> {
        let bits = self.bits;
        let pf = 32 / bits as usize;
        let (qw, qz, sc) = (format!("{module}.qweight"), format!("{module}.qzeros"), format!("{module}.scales"));
        check_divides(shards, &qw, "in_features", inp, pf)?;
        check_divides(shards, &qz, "out_features", out, pf)?;
        // qweight first: its shape confirms `inp` and `out` before anything their size is allocated.
        let qweight = shards.ints(&qw, &[inp / pf, out])?;
        let (n_groups, g_idx) = group_index(shards, &format!("{module}.g_idx"), self.group, inp)?;
        let qzeros = shards.ints(&qz, &[n_groups, out / pf])?;
        let scales = shards.floats(&sc, &[n_groups, out])?;
        let v1 = !self.v2;
        let mut w = vec![0f32; out * inp];
        for (i, &g) in g_idx.iter().enumerate() {
            for o in 0..out {
                let q = field(qweight[(i / pf) * out + o], bits, i % pf);
                // v1: AutoGPTQ adds 1 and masks again, so a stored 2^bits − 1 is zero point 0.
                let z = (field(qzeros[g * (out / pf) + o / pf], bits, o % pf) + i32::from(v1)) & ((1 << bits) - 1);
                w[o * inp + i] = (q - z) as f32 * scales[g * out + o];
            }
        }
        Ok(w)
    }

    /// Packs the codes of linear layer `module` as `qweight`, `qzeros`, `scales` and `g_idx`
    /// (see the module doc): the inverse of the reader. Column `j` of `codes` holds input
    /// `order[j]` (act order: the columns were quantized in that order, and input `order[j]` falls
    /// in group `j / codes.group`); `order` is `0..inp` otherwise. `codes.out` and `codes.inp` must
    /// be multiples of `32 / bits`. A v1 zero point 0 is stored as `2^bits − 1`, which the `+ 1`
    /// then mask reads back as 0.
    ///
    /// # Shapes
    /// - `codes`: as [`IntCodes`] says; `order`: `[inp]`, a permutation; returns `qweight`
    ///   `[inp / pf, out]`, `qzeros` `[groups, out / pf]`, `scales` `[groups, out]`, `g_idx` `[inp]`.
    pub fn pack(&self, module: &str, codes: &IntCodes<'_>, order: &[usize]) -> Vec<HfTensor> {
        let (out, inp, bits) = (codes.out, codes.inp, self.bits);
        let pf = 32 / bits as usize;
        let groups = codes.groups();
        let mut qweight = vec![0i32; inp / pf * out];
        let mut g_idx = vec![0i32; inp];
        for (j, &i) in order.iter().enumerate() {
            g_idx[i] = (j / codes.group.max(1)) as i32;
            for o in 0..out {
                put(&mut qweight[(i / pf) * out + o], bits, i % pf, codes.codes[o * inp + j]);
            }
        }
        let mut qzeros = vec![0i32; groups * (out / pf)];
        let mut scales = vec![0f32; groups * out];
        for g in 0..groups {
            for o in 0..out {
                let z = codes.zeros[o * groups + g];
                let stored = if self.v2 { z } else { z - 1 };
                put(&mut qzeros[g * (out / pf) + o / pf], bits, o % pf, stored);
                scales[g * out + o] = codes.scales[o * groups + g];
            }
        }
        let name = |suffix: &str| format!("{module}.{suffix}");
        vec![
            HfTensor::i32(name("qweight"), vec![inp / pf, out], &qweight),
            HfTensor::i32(name("qzeros"), vec![groups, out / pf], &qzeros),
            HfTensor::floats(name("scales"), codes.scale_dtype, vec![groups, out], &scales),
            HfTensor::i32(name("g_idx"), vec![inp], &g_idx),
        ]
    }
}
