//! **AWQ** (`quant_method: awq`, `version: gemm`, 4 bits, `zero_point: true`): the config,
//! unpacking on load and packing for fixtures, side by side.
//!
//! Following AutoAWQ `awq/modules/linear/gemm.py` `WQLinear_GEMM.from_linear` and
//! `awq/utils/packing_utils.py` (`AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]`, `AWQ_REVERSE_ORDER =
//! [0, 4, 1, 5, 2, 6, 3, 7]`): `qweight` I32 `[in, out / 8]`, nibble `k` (bits `4k` up) of
//! `qweight[i, c]` holds output `8c + AWQ_ORDER[k]`; `qzeros` I32 `[groups, out / 8]` packed alike;
//! `scales` F16 `[groups, out]`; groups of G consecutive inputs. `w[o, i] = (q − z) · s`. `gemv`,
//! `gemv_fast`, `marlin`, `exllama` and `ipex` layouts are refused.

use serde_json::json;

use super::fields::Fields;
use super::packing::{HfTensor, IntCodes, check_divides, field, group_name, put};
use crate::LoadError;
use crate::hf::shards::Shards;

/// AWQ GEMM's `AWQ_ORDER`: nibble `k` of packed column `c` holds output `8c + ORDER[k]`.
const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// AWQ GEMM's `AWQ_REVERSE_ORDER`: output `8c + k` is nibble `REVERSE[k]` of packed column `c`.
const AWQ_REVERSE_ORDER: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// An AWQ `quantization_config` (GEMM, 4 bits, zero points).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Awq {
    /// Inputs per group; `None` for one group per row (`group_size: -1`).
    pub group: Option<usize>,
}

impl Awq {
    /// Parses the config (see the module doc).
    pub(crate) fn parse(f: &Fields<'_>) -> Result<Self, LoadError> {
        let version = f.str("version")?.unwrap_or("gemm");
        if !version.eq_ignore_ascii_case("gemm") {
            return Err(f.unsupported("version", version, "gemm"));
        }
        let bits_key = if f.get("w_bit").is_some() { "w_bit" } else { "bits" };
        match f.int(bits_key)? {
            Some(4) => {}
            other => return Err(f.unsupported(bits_key, other.map_or("(missing)".into(), |b| b.to_string()), "4")),
        }
        let group_key = if f.get("q_group_size").is_some() { "q_group_size" } else { "group_size" };
        let group = f.group_size(group_key)?;
        if !f.flag("zero_point", true)? {
            return Err(f.unsupported("zero_point", false, "true (GEMM's zero points)"));
        }
        Ok(Awq { group })
    }

    /// The format's name in reports: `awq 4-bit g128`.
    pub(crate) fn summary(&self) -> String {
        format!("awq 4-bit {}", group_name(self.group))
    }

    /// `config.json`'s `quantization_config` for this config, as JSON text.
    pub fn quantization_config(&self) -> String {
        json!({
            "quant_method": "awq",
            "version": "gemm",
            "bits": 4,
            "group_size": self.group.map_or(-1, |g| g as i64),
            "zero_point": true,
            "modules_to_not_convert": null,
        })
        .to_string()
    }

    /// Dequantizes linear layer `module`.
    ///
    /// # Shapes
    /// - `qweight`: `[inp, out / 8]`, `qzeros`: `[groups, out / 8]`, `scales`: `[groups, out]`;
    ///   returns `[out, inp]`.
    pub(crate) fn unpack(&self, shards: &Shards, module: &str, out: usize, inp: usize) -> Result<Vec<f32>, LoadError> {
        let (qw, qz, sc) = (format!("{module}.qweight"), format!("{module}.qzeros"), format!("{module}.scales"));
        check_divides(shards, &qw, "out_features", out, 8)?;
        let size = self.group.unwrap_or(inp).max(1);
        let n_groups = inp.div_ceil(size);
        let qweight = shards.ints(&qw, &[inp, out / 8])?;
        let qzeros = shards.ints(&qz, &[n_groups, out / 8])?;
        let scales = shards.floats(&sc, &[n_groups, out])?;
        let mut w = vec![0f32; out * inp];
        for i in 0..inp {
            let g = i / size;
            for o in 0..out {
                let k = AWQ_REVERSE_ORDER[o % 8];
                let q = field(qweight[i * (out / 8) + o / 8], 4, k);
                let z = field(qzeros[g * (out / 8) + o / 8], 4, k);
                w[o * inp + i] = (q - z) as f32 * scales[g * out + o];
            }
        }
        Ok(w)
    }

    /// Packs the 4-bit codes of linear layer `module` as `qweight`, `qzeros` and `scales` (see the
    /// module doc): the inverse of the reader. `codes.out` must be a multiple of 8.
    ///
    /// # Shapes
    /// - `codes`: as [`IntCodes`] says; returns `qweight` `[inp, out / 8]`, `qzeros`
    ///   `[groups, out / 8]`, `scales` `[groups, out]`.
    pub fn pack(module: &str, codes: &IntCodes<'_>) -> Vec<HfTensor> {
        let (out, inp, groups) = (codes.out, codes.inp, codes.groups());
        let cols = out / 8;
        let mut qweight = vec![0i32; inp * cols];
        let mut qzeros = vec![0i32; groups * cols];
        for c in 0..cols {
            for (k, &o) in AWQ_ORDER.iter().enumerate() {
                let o = 8 * c + o;
                for i in 0..inp {
                    put(&mut qweight[i * cols + c], 4, k, codes.codes[o * inp + i]);
                }
                for g in 0..groups {
                    put(&mut qzeros[g * cols + c], 4, k, codes.zeros[o * groups + g]);
                }
            }
        }
        let scales: Vec<f32> = (0..groups * out).map(|k| codes.scales[(k % out) * groups + k / out]).collect();
        let name = |suffix: &str| format!("{module}.{suffix}");
        vec![
            HfTensor::i32(name("qweight"), vec![inp, cols], &qweight),
            HfTensor::i32(name("qzeros"), vec![groups, cols], &qzeros),
            HfTensor::floats(name("scales"), codes.scale_dtype, vec![groups, out], &scales),
        ]
    }
}
