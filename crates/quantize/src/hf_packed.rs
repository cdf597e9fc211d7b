//! Packs a [`HostModel`]'s linear layers in the layouts of Hugging Face quantized checkpoints
//! (GPTQ, AWQ, compressed-tensors, FP8), so that qdrift's reader of those folders
//! (`qdrift_load::read_hf_folder`) can be tested without a hub; written to a folder by
//! [`crate::write_hf_quantized`].
//!
//! The codes and scales are qdrift's own schemes' (`int.rs`, `fp8.rs`), re-packed, so a folder
//! read back equals the scheme's dequantized weights bit for bit (see [`HfLayout`] for which
//! scheme each layout carries). The layouts are the ones `qdrift-load`'s `hf_quant.rs` documents
//! and cites (AutoGPTQ / GPTQModel `pack`, AutoAWQ `WQLinear_GEMM.from_linear`,
//! compressed-tensors `pack_to_int32`, `transformers`' `FP8Linear`); a linear layer whose
//! dimensions a layout cannot pack (GPTQ needs `in` and `out` multiples of `32 / bits`, AWQ `out`
//! a multiple of 8) is left unquantized, as quantizers skip such layers.
//!
//! q/k rows are packed in the rotate-half layout Hugging Face uses (each scheme quantizes rows
//! independently, so packing the permuted matrix is permuting the packed one).

use qdrift_load::{HostModel, HostTensor, rotate_half_row_order};

use crate::error::QuantizeError;
use crate::fp8::{fp8_decode, fp8_encode};
use crate::scheme::{Fp8Format, Scheme};
use crate::{PackedDtype, QuantizedMatrix, quantize};

/// A checkpoint layout and the qdrift scheme whose codes it stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HfLayout {
    /// GPTQ `qweight`/`qzeros`/`scales`/`g_idx`. 4 bits: `int4-gG[-asym]` codes (unsigned `q + 8`
    /// and zero point 8 when symmetric), F16 scales; 8 bits: `int8` codes (`q + 128`, zero 128),
    /// one group per row (`group: None`), F32 scales (real checkpoints store F16; F32 keeps
    /// `int8`'s scales exact). `act_order` quantizes the columns in a fixed permuted order and
    /// records it in `g_idx` (`desc_act`). `v2` writes GPTQModel's `gptq_v2` zero points, else
    /// AutoGPTQ's v1 `z − 1` (a zero point 0 cannot be stored in v1 and is an error).
    Gptq {
        /// 4 or 8.
        bits: u32,
        /// Group size along the input (4 bits); `None` for one group per row.
        group: Option<usize>,
        /// Asymmetric (4 bits).
        asym: bool,
        /// Permuted group order through `g_idx`.
        act_order: bool,
        /// `checkpoint_format: gptq_v2`.
        v2: bool,
    },
    /// AWQ GEMM: `int4-gG-asym` codes, F16 scales.
    Awq {
        /// Group size along the input.
        group: usize,
    },
    /// compressed-tensors `pack-quantized`: `int4-gG[-asym]` (4 bits) or `int8` (8 bits, per
    /// channel, F32 scales).
    CtPacked {
        /// 4 or 8.
        bits: u32,
        /// Group size (4 bits).
        group: usize,
        /// Asymmetric (4 bits).
        asym: bool,
    },
    /// compressed-tensors `int-quantized`: `int8` codes, F32 channel scales, and with
    /// `activations` dynamic per-token int8 input activations (`w8a8-int8`).
    CtInt8 {
        /// Declare `input_activations`.
        activations: bool,
    },
    /// compressed-tensors `float-quantized`: `fp8-e4m3` codes, F32 channel scales, and with
    /// `activations` dynamic per-token FP8 input activations (`w8a8-fp8`).
    CtFp8 {
        /// Declare `input_activations`.
        activations: bool,
    },
    /// compressed-tensors `float-quantized`: `fp8-e4m3` codes, F32 channel scales, and dynamic
    /// FP8 input activations per token and group of `group` inputs (`strategy: group`, as
    /// llm-compressor's `FP8_BLOCK` preset declares them; `fp8-e4m3+a-fp8-gG`).
    CtFp8TokenGroup {
        /// Activation group size (`input_activations.group_size`).
        group: usize,
    },
    /// `quant_method: fp8`: `fp8-e4m3-tensor` codes with `weight_scale_inv` `[1]`
    /// (`block: None`), or `block × block` blocks with scale `amax / 448` each.
    Fp8 {
        /// Block size, as `weight_block_size: [block, block]`.
        block: Option<usize>,
    },
}

/// One tensor to write, in safetensors terms.
#[derive(Debug, Clone, PartialEq)]
pub struct HfTensor {
    /// Full Hugging Face name (`model.layers.0.self_attn.q_proj.qweight`).
    pub name: String,
    /// Element type.
    pub dtype: PackedDtype,
    /// Shape in elements.
    pub shape: Vec<usize>,
    /// Little-endian contents.
    pub bytes: Vec<u8>,
}

/// The packed linear layers of a model.
#[derive(Debug, Clone)]
pub struct HfPacked {
    /// The tensors that replace each quantized layer's `.weight`.
    pub tensors: Vec<HfTensor>,
    /// The `.weight` names the packed tensors replace.
    pub replaced: Vec<String>,
    /// `config.json`'s `quantization_config` object, as JSON text.
    pub quantization_config: String,
    /// The model a reader must return: the input with each packed layer dequantized (in
    /// [`HostModel`]'s interleaved q/k layout).
    pub dequantized: HostModel,
}

/// Packs the seven linear layers of every block of `model` in `layout` (embedding, norms and
/// head are left to the caller).
///
/// # Errors
/// A scheme's error (non-finite weight, scale overflow), or [`QuantizeError::HfLayout`] for a
/// parameter the layout does not have.
pub fn pack_hf(model: &HostModel, layout: HfLayout) -> Result<HfPacked, QuantizeError> {
    check_layout(layout)?;
    let mut dequantized = model.clone();
    let mut tensors = Vec::new();
    let mut replaced = Vec::new();
    let arch = &model.arch;
    for (i, layer) in dequantized.layers.iter_mut().enumerate() {
        for (name, w) in layer.linears_mut() {
            let heads = match name {
                "self_attn.q_proj" => Some(arch.n_heads),
                "self_attn.k_proj" => Some(arch.n_kv_heads),
                _ => None,
            };
            let (out, inp) = (w.shape[0], w.shape[1]);
            if !packable(layout, out, inp) {
                continue;
            }
            let module = format!("model.layers.{i}.{name}");
            let hf = heads.map_or_else(|| w.data.clone(), |h| rows_to_hf(w, h));
            let (parts, values) = pack_matrix(&module, &hf, out, inp, layout)?;
            tensors.extend(parts);
            replaced.push(format!("{module}.weight"));
            w.data = heads.map_or(values.clone(), |h| rows_from_hf(&values, out, inp, h));
        }
    }
    Ok(HfPacked { tensors, replaced, quantization_config: config_json(layout), dequantized })
}

fn check_layout(layout: HfLayout) -> Result<(), QuantizeError> {
    let bad = |m: &str| Err(QuantizeError::HfLayout { message: m.to_string() });
    match layout {
        HfLayout::Gptq { bits: 8, group: Some(_), .. } => bad("GPTQ 8-bit packs int8's per-row scales: group None"),
        HfLayout::Gptq { bits: 8, asym: true, .. } => bad("GPTQ 8-bit packs int8, which is symmetric"),
        HfLayout::Gptq { bits: 4, group: None, .. } => bad("GPTQ 4-bit packs int4-gG: give a group"),
        HfLayout::Gptq { bits, .. } if bits != 4 && bits != 8 => bad("GPTQ bits are 4 or 8"),
        HfLayout::CtPacked { bits: 8, asym: true, .. } => bad("pack-quantized 8-bit packs int8, which is symmetric"),
        HfLayout::CtPacked { bits, .. } if bits != 4 && bits != 8 => bad("pack-quantized bits are 4 or 8"),
        HfLayout::Awq { group: 0 }
        | HfLayout::CtPacked { group: 0, .. }
        | HfLayout::Fp8 { block: Some(0) }
        | HfLayout::CtFp8TokenGroup { group: 0 } => bad("group and block sizes are positive"),
        HfLayout::Gptq { group: Some(0), .. } => bad("group sizes are positive"),
        _ => Ok(()),
    }
}

/// Whether `layout` can pack an `[out, inp]` matrix.
fn packable(layout: HfLayout, out: usize, inp: usize) -> bool {
    match layout {
        HfLayout::Gptq { bits, .. } => {
            let pf = 32 / bits as usize;
            out.is_multiple_of(pf) && inp.is_multiple_of(pf)
        }
        HfLayout::Awq { .. } => out.is_multiple_of(8),
        _ => true,
    }
}

/// Interleaved rows to rotate-half rows: HF row `r` is interleaved row `order[r]`.
///
/// # Shapes
/// - `w`: `[rows, cols]`; returns `[rows, cols]`.
fn rows_to_hf(w: &HostTensor, heads: usize) -> Vec<f32> {
    let (rows, cols) = (w.shape[0], w.shape[1]);
    let order = rotate_half_row_order(heads, rows / heads.max(1));
    order.iter().flat_map(|&o| w.data[o * cols..(o + 1) * cols].iter().copied()).collect()
}

/// The inverse of [`rows_to_hf`].
///
/// # Shapes
/// - `hf`: `[rows, cols]`; returns `[rows, cols]`.
fn rows_from_hf(hf: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    let order = rotate_half_row_order(heads, rows / heads.max(1));
    let mut out = vec![0.0; hf.len()];
    for (r, &o) in order.iter().enumerate() {
        out[o * cols..(o + 1) * cols].copy_from_slice(&hf[r * cols..(r + 1) * cols]);
    }
    out
}

/// Integer codes, zero points and scales of an int scheme, unpacked.
struct Affine {
    /// `[rows, cols]`: signed codes (symmetric) or unsigned (asymmetric).
    q: Vec<i32>,
    /// `[rows, groups]`; 0 when symmetric.
    z: Vec<i32>,
    /// `[rows, groups]`.
    s: Vec<f32>,
    groups: usize,
}

/// Unpacks qdrift's `int8` / `int4-gG[-asym]` parts.
///
/// # Shapes
/// - `m`: `[rows, cols]`; codes `[rows, cols]`, zeros and scales `[rows, groups]`.
fn affine(m: &QuantizedMatrix) -> Affine {
    let (rows, cols) = (m.rows(), m.cols());
    let parts = m.parts();
    let find = |n: &str| parts.iter().find(|p| p.name == n).map(|p| p.bytes.as_slice()).unwrap_or(&[]);
    let nibble = |b: &[u8], k: usize| (b[k / 2] >> (4 * (k % 2))) & 0x0F;
    match m.scheme() {
        Scheme::Int8 => Affine {
            q: find("codes").iter().map(|&b| i32::from(b as i8)).collect(),
            z: vec![0; rows],
            s: find("scales").chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            groups: 1,
        },
        Scheme::Int4 { group, asym } => {
            let groups = cols.div_ceil(group);
            let (codes, zeros) = (find("codes"), find("zeros"));
            let (row_bytes, zero_bytes) = (cols.div_ceil(2), groups.div_ceil(2));
            let q = (0..rows * cols)
                .map(|k| {
                    let raw = nibble(&codes[(k / cols) * row_bytes..], k % cols);
                    if asym { i32::from(raw) } else { i32::from(((raw << 4) as i8) >> 4) }
                })
                .collect();
            let z = (0..rows * groups)
                .map(|k| if asym { i32::from(nibble(&zeros[(k / groups) * zero_bytes..], k % groups)) } else { 0 })
                .collect();
            let s = find("scales").chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect();
            Affine { q, z, s, groups }
        }
        _ => Affine { q: Vec::new(), z: Vec::new(), s: Vec::new(), groups: 1 },
    }
}

fn tensor(name: String, dtype: PackedDtype, shape: Vec<usize>, bytes: Vec<u8>) -> HfTensor {
    HfTensor { name, dtype, shape, bytes }
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect()
}

/// ORs `value` into bits `bits·k` up of `word` (low bits first).
fn put(word: &mut i32, bits: u32, k: usize, value: i32) {
    let mask = (1u32 << bits) - 1;
    *word = (*word as u32 | ((value as u32 & mask) << (bits as usize * k))) as i32;
}

/// A column permutation for act-order fixtures: `j ↦ (7j + 3) mod n` (a bijection when 7 does
/// not divide `n`; the identity otherwise).
fn act_order_perm(n: usize) -> Vec<usize> {
    if n.is_multiple_of(7) { (0..n).collect() } else { (0..n).map(|j| (7 * j + 3) % n).collect() }
}

/// Packs one `[out, inp]` matrix (HF row order) of `module`; returns its tensors and the
/// dequantized values (HF row order).
///
/// # Shapes
/// - `w`: `[out, inp]`; returns values `[out, inp]`.
fn pack_matrix(
    module: &str,
    w: &[f32],
    out: usize,
    inp: usize,
    layout: HfLayout,
) -> Result<(Vec<HfTensor>, Vec<f32>), QuantizeError> {
    let name = |suffix: &str| format!("{module}.{suffix}");
    Ok(match layout {
        HfLayout::Gptq { bits, group, asym, act_order, v2 } => {
            let scheme = if bits == 8 { Scheme::Int8 } else { Scheme::Int4 { group: group.unwrap_or(inp), asym } };
            // Act order: quantize the permuted columns; column `perm[j]` falls in group `j / G`.
            let perm = if act_order { act_order_perm(inp) } else { (0..inp).collect() };
            let permuted: Vec<f32> = (0..out * inp).map(|k| w[(k / inp) * inp + perm[k % inp]]).collect();
            let m = quantize(&scheme, &permuted, out, inp)?;
            let a = affine(&m);
            let size = group.unwrap_or(inp);
            let pf = 32 / bits as usize;
            let offset = if asym { 0 } else { 1i32 << (bits - 1) };
            let mut qweight = vec![0i32; inp / pf * out];
            let mut g_idx = vec![0i32; inp];
            for (j, &i) in perm.iter().enumerate() {
                g_idx[i] = (j / size) as i32;
                for o in 0..out {
                    put(&mut qweight[(i / pf) * out + o], bits, i % pf, a.q[o * inp + j] + offset);
                }
            }
            let mut qzeros = vec![0i32; a.groups * (out / pf)];
            let mut scales = vec![0f32; a.groups * out];
            for g in 0..a.groups {
                for o in 0..out {
                    let z = a.z[o * a.groups + g] + offset;
                    // v1 stores z − 1 in `bits` bits (`put` masks: zero point 0 is stored as
                    // 2^bits − 1, which AutoGPTQ's `+ 1` then mask reads back as 0).
                    let stored = if v2 { z } else { z - 1 };
                    put(&mut qzeros[g * (out / pf) + o / pf], bits, o % pf, stored);
                    scales[g * out + o] = a.s[o * a.groups + g];
                }
            }
            let (scale_dtype, scale_bytes) =
                if bits == 8 { (PackedDtype::F32, f32_bytes(&scales)) } else { (PackedDtype::F16, f16_bytes(&scales)) };
            let parts = vec![
                tensor(name("qweight"), PackedDtype::I32, vec![inp / pf, out], i32_bytes(&qweight)),
                tensor(name("qzeros"), PackedDtype::I32, vec![a.groups, out / pf], i32_bytes(&qzeros)),
                tensor(name("scales"), scale_dtype, vec![a.groups, out], scale_bytes),
                tensor(name("g_idx"), PackedDtype::I32, vec![inp], i32_bytes(&g_idx)),
            ];
            let d = m.dequantize();
            let mut values = vec![0f32; out * inp];
            for (j, &i) in perm.iter().enumerate() {
                for o in 0..out {
                    values[o * inp + i] = d[o * inp + j];
                }
            }
            (parts, values)
        }
        HfLayout::Awq { group } => {
            const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];
            let m = quantize(&Scheme::Int4 { group, asym: true }, w, out, inp)?;
            let a = affine(&m);
            let cols = out / 8;
            let mut qweight = vec![0i32; inp * cols];
            let mut qzeros = vec![0i32; a.groups * cols];
            for c in 0..cols {
                for (k, &o) in AWQ_ORDER.iter().enumerate() {
                    let o = 8 * c + o;
                    for i in 0..inp {
                        put(&mut qweight[i * cols + c], 4, k, a.q[o * inp + i]);
                    }
                    for g in 0..a.groups {
                        put(&mut qzeros[g * cols + c], 4, k, a.z[o * a.groups + g]);
                    }
                }
            }
            let scales: Vec<f32> = (0..a.groups * out).map(|k| a.s[(k % out) * a.groups + k / out]).collect();
            let parts = vec![
                tensor(name("qweight"), PackedDtype::I32, vec![inp, cols], i32_bytes(&qweight)),
                tensor(name("qzeros"), PackedDtype::I32, vec![a.groups, cols], i32_bytes(&qzeros)),
                tensor(name("scales"), PackedDtype::F16, vec![a.groups, out], f16_bytes(&scales)),
            ];
            (parts, m.dequantize())
        }
        HfLayout::CtPacked { bits, group, asym } => {
            let scheme = if bits == 8 { Scheme::Int8 } else { Scheme::Int4 { group, asym } };
            let m = quantize(&scheme, w, out, inp)?;
            let a = affine(&m);
            let pf = 32 / bits as usize;
            let offset = 1i32 << (bits - 1);
            // compressed-tensors' codes are signed: an asymmetric unsigned q and z shift by 2^(b−1).
            let shift = if asym { offset } else { 0 };
            let words = inp.div_ceil(pf);
            let mut packed = vec![0i32; out * words];
            for o in 0..out {
                for i in 0..inp {
                    put(&mut packed[o * words + i / pf], bits, i % pf, a.q[o * inp + i] - shift + offset);
                }
            }
            let mut parts = vec![
                tensor(name("weight_packed"), PackedDtype::I32, vec![out, words], i32_bytes(&packed)),
                tensor(
                    name("weight_shape"),
                    PackedDtype::I64,
                    vec![2],
                    [out as i64, inp as i64].iter().flat_map(|x| x.to_le_bytes()).collect(),
                ),
            ];
            parts.push(if bits == 8 {
                tensor(name("weight_scale"), PackedDtype::F32, vec![out, 1], f32_bytes(&a.s))
            } else {
                tensor(name("weight_scale"), PackedDtype::F16, vec![out, a.groups], f16_bytes(&a.s))
            });
            if asym {
                let mut zp = vec![0i32; out.div_ceil(pf) * a.groups];
                for o in 0..out {
                    for g in 0..a.groups {
                        put(&mut zp[(o / pf) * a.groups + g], bits, o % pf, a.z[o * a.groups + g] - shift + offset);
                    }
                }
                parts.push(tensor(
                    name("weight_zero_point"),
                    PackedDtype::I32,
                    vec![out.div_ceil(pf), a.groups],
                    i32_bytes(&zp),
                ));
            }
            (parts, m.dequantize())
        }
        HfLayout::CtInt8 { .. } => {
            let m = quantize(&Scheme::Int8, w, out, inp)?;
            let a = affine(&m);
            let codes: Vec<u8> = a.q.iter().map(|&q| q as i8 as u8).collect();
            let parts = vec![
                tensor(name("weight"), PackedDtype::I8, vec![out, inp], codes),
                tensor(name("weight_scale"), PackedDtype::F32, vec![out, 1], f32_bytes(&a.s)),
            ];
            (parts, m.dequantize())
        }
        HfLayout::CtFp8 { .. } | HfLayout::CtFp8TokenGroup { .. } | HfLayout::Fp8 { block: None } => {
            let per_tensor = matches!(layout, HfLayout::Fp8 { .. });
            let m = quantize(&Scheme::Fp8 { format: Fp8Format::E4M3, per_tensor }, w, out, inp)?;
            let parts = m.parts();
            let find = |n: &str| parts.iter().find(|p| p.name == n).map(|p| p.bytes.clone()).unwrap_or_default();
            let (scale_name, scale_shape) =
                if per_tensor { ("weight_scale_inv", vec![1]) } else { ("weight_scale", vec![out, 1]) };
            let parts = vec![
                tensor(name("weight"), PackedDtype::F8E4M3, vec![out, inp], find("codes")),
                tensor(name(scale_name), PackedDtype::F32, scale_shape, find("scales")),
            ];
            (parts, m.dequantize())
        }
        HfLayout::Fp8 { block: Some(b) } => {
            let (br, bc) = (out.div_ceil(b), inp.div_ceil(b));
            let mut scales = vec![0f32; br * bc];
            for (k, &v) in w.iter().enumerate() {
                let s = &mut scales[(k / inp / b) * bc + (k % inp) / b];
                *s = s.max(v.abs());
            }
            for s in &mut scales {
                *s /= Fp8Format::E4M3.max_finite();
            }
            let scale_of = |k: usize| scales[(k / inp / b) * bc + (k % inp) / b];
            let codes: Vec<u8> = w
                .iter()
                .enumerate()
                .map(|(k, &v)| if scale_of(k) == 0.0 { 0 } else { fp8_encode(Fp8Format::E4M3, v / scale_of(k)) })
                .collect();
            let values = codes.iter().enumerate().map(|(k, &c)| fp8_decode(Fp8Format::E4M3, c) * scale_of(k)).collect();
            let parts = vec![
                tensor(name("weight"), PackedDtype::F8E4M3, vec![out, inp], codes),
                tensor(name("weight_scale_inv"), PackedDtype::F32, vec![br, bc], f32_bytes(&scales)),
            ];
            (parts, values)
        }
    })
}

/// `quantization_config` for `layout`, as JSON text.
fn config_json(layout: HfLayout) -> String {
    let ct = |format: &str, weights: String, acts: &str| {
        format!(
            r#"{{"quant_method": "compressed-tensors", "format": "{format}", "quantization_status": "compressed",
  "ignore": ["lm_head"], "kv_cache_scheme": null, "sparsity_config": null,
  "config_groups": {{"group_0": {{"targets": ["Linear"], "weights": {weights}, "input_activations": {acts}, "output_activations": null}}}}}}"#
        )
    };
    let act = |on: bool, ty: &str| {
        if on {
            format!(r#"{{"num_bits": 8, "type": "{ty}", "strategy": "token", "dynamic": true, "symmetric": true}}"#)
        } else {
            "null".to_string()
        }
    };
    match layout {
        HfLayout::Gptq { bits, group, asym, act_order, v2 } => format!(
            r#"{{"quant_method": "gptq", "bits": {bits}, "group_size": {}, "desc_act": {act_order}, "sym": {}, "checkpoint_format": "{}"}}"#,
            group.map_or(-1, |g| g as i64),
            !asym,
            if v2 { "gptq_v2" } else { "gptq" }
        ),
        HfLayout::Awq { group } => format!(
            r#"{{"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": {group}, "zero_point": true, "modules_to_not_convert": null}}"#
        ),
        HfLayout::CtPacked { bits, group, asym } => {
            let weights = if bits == 8 {
                r#"{"num_bits": 8, "type": "int", "symmetric": true, "strategy": "channel", "dynamic": false}"#
                    .to_string()
            } else {
                format!(
                    r#"{{"num_bits": 4, "type": "int", "symmetric": {}, "strategy": "group", "group_size": {group}, "dynamic": false}}"#,
                    !asym
                )
            };
            ct("pack-quantized", weights, "null")
        }
        HfLayout::CtInt8 { activations } => ct(
            "int-quantized",
            r#"{"num_bits": 8, "type": "int", "symmetric": true, "strategy": "channel", "dynamic": false}"#.into(),
            &act(activations, "int"),
        ),
        HfLayout::CtFp8 { activations } => ct(
            "float-quantized",
            r#"{"num_bits": 8, "type": "float", "symmetric": true, "strategy": "channel", "dynamic": false}"#.into(),
            &act(activations, "float"),
        ),
        HfLayout::CtFp8TokenGroup { group } => ct(
            "float-quantized",
            r#"{"num_bits": 8, "type": "float", "symmetric": true, "strategy": "channel", "dynamic": false}"#.into(),
            &format!(
                r#"{{"num_bits": 8, "type": "float", "strategy": "group", "group_size": {group}, "dynamic": true, "symmetric": true}}"#
            ),
        ),
        HfLayout::Fp8 { block } => format!(
            r#"{{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": {}}}"#,
            block.map_or("null".to_string(), |b| format!("[{b}, {b}]"))
        ),
    }
}
