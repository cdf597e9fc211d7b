//! Packs a [`HostModel`]'s linear layers in the layouts of Hugging Face quantized checkpoints
//! (GPTQ, AWQ, compressed-tensors, FP8), so that qdrift's reader of those folders
//! (`qdrift_load::read_hf_folder`) can be tested without a hub; written to a folder by
//! [`crate::write_hf_quantized`].
//!
//! The codes and scales are qdrift's own schemes' (`qdrift-codecs`' `formats/int.rs`, whose
//! [`QuantizedMatrix::affine`] gives the unsigned codes, and `formats/fp8.rs`), handed to the
//! packing code of each layout, which sits beside its unpacking code in `qdrift-load`
//! ([`qdrift_load::hf::quant`]: AutoGPTQ / GPTQModel `pack`, AutoAWQ `WQLinear_GEMM.from_linear`,
//! compressed-tensors `pack_to_int32`, `transformers`' `FP8Linear`), so a folder read back equals
//! the scheme's dequantized weights bit for bit (see [`HfLayout`] for which scheme each layout
//! carries). This module chooses the scheme, quantizes, and turns the scheme's parts into the
//! layout's codes; a linear layer whose dimensions a layout cannot pack (GPTQ needs `in` and `out`
//! multiples of `32 / bits`, AWQ `out` a multiple of 8) is left unquantized, as quantizers skip
//! such layers.
//!
//! q/k rows are packed in the rotate-half layout Hugging Face uses (each scheme quantizes rows
//! independently, so packing the permuted matrix is permuting the packed one).

use qdrift_load::hf::quant::{
    Awq, Compressed, CtActivations, CtFormat, CtGroup, CtScheme, CtWeights, Fp8, Fp8Codes, Gptq, HfDtype, IntCodes,
    Strategy,
};
use qdrift_load::ofp8::Ofp8;
use qdrift_load::{ActivationGranularity, HostModel, HostTensor, rotate_half_row_order};

pub use qdrift_load::hf::quant::HfTensor;

use qdrift_codecs::{AffineCodes, Fp8Format, QuantizeError, QuantizedMatrix, Scheme, fp8_decode, fp8_encode, quantize};

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
            let heads = match name.role {
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
    Ok(HfPacked { tensors, replaced, quantization_config: quantization_config(layout), dequantized })
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

/// An integer scheme's (`int8` / `int4-gG[-asym]`) codes in the unsigned affine form the integer
/// layouts store ([`QuantizedMatrix::affine`]: a symmetric scheme's signed code `q` is
/// `q + 2^(bits−1)` and its zero point `2^(bits−1)`).
///
/// # Errors
/// [`QuantizeError::HfLayout`] for a scheme without integer codes (a layout here only quantizes
/// with an integer scheme).
fn affine(m: &QuantizedMatrix) -> Result<AffineCodes, QuantizeError> {
    m.affine().ok_or_else(|| QuantizeError::HfLayout { message: format!("{} has no integer codes", m.scheme()) })
}

/// The codes as the layouts take them, the scales stored as `scale_dtype`.
fn int_codes<'a>(a: &'a AffineCodes, m: &QuantizedMatrix, scale_dtype: HfDtype) -> IntCodes<'a> {
    IntCodes {
        out: m.rows(),
        inp: m.cols(),
        group: a.group,
        codes: &a.codes,
        zeros: &a.zeros,
        scales: &a.scales,
        scale_dtype,
    }
}

/// The F32 scales of an FP8 scheme's parts.
fn fp8_scales(m: &QuantizedMatrix) -> Vec<f32> {
    let parts = m.parts();
    let bytes = parts.iter().find(|p| p.name == "scales").map(|p| p.bytes.as_slice()).unwrap_or(&[]);
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// The FP8 codes of an FP8 scheme's parts.
fn fp8_codes(m: &QuantizedMatrix) -> Vec<u8> {
    m.parts().into_iter().find(|p| p.name == "codes").map(|p| p.bytes).unwrap_or_default()
}

/// Int8 scales as F32 (exact), int4 scales as F16 (the scheme's own).
fn int_scale_dtype(bits: u32) -> HfDtype {
    if bits == 8 { HfDtype::F32 } else { HfDtype::F16 }
}

/// A column permutation for act-order fixtures: `j ↦ (7j + 3) mod n` (a bijection when 7 does
/// not divide `n`; the identity otherwise).
fn act_order_perm(n: usize) -> Vec<usize> {
    if n.is_multiple_of(7) { (0..n).collect() } else { (0..n).map(|j| (7 * j + 3) % n).collect() }
}

/// The packed tensors of one matrix and its dequantized values (HF row order).
type Packed = (Vec<HfTensor>, Vec<f32>);

/// Packs one `[out, inp]` matrix (HF row order) of `module`; returns its tensors and the
/// dequantized values (HF row order).
///
/// # Shapes
/// - `w`: `[out, inp]`; returns values `[out, inp]`.
fn pack_matrix(module: &str, w: &[f32], out: usize, inp: usize, layout: HfLayout) -> Result<Packed, QuantizeError> {
    match layout {
        HfLayout::Gptq { bits, group, asym, act_order, v2 } => {
            let gptq = Gptq { bits, group, desc_act: act_order, sym: !asym, v2 };
            pack_gptq(module, w, [out, inp], gptq)
        }
        HfLayout::Awq { group } => {
            let m = quantize(&Scheme::Int4 { group, asym: true }, w, out, inp)?;
            let a = affine(&m)?;
            Ok((Awq::pack(module, &int_codes(&a, &m, HfDtype::F16)), m.dequantize()))
        }
        HfLayout::CtPacked { bits, group, asym } => {
            let scheme = if bits == 8 { Scheme::Int8 } else { Scheme::Int4 { group, asym } };
            let m = quantize(&scheme, w, out, inp)?;
            let a = affine(&m)?;
            let parts = ct_scheme(layout).pack_int(module, &int_codes(&a, &m, int_scale_dtype(bits)));
            Ok((parts.unwrap_or_default(), m.dequantize()))
        }
        HfLayout::CtInt8 { .. } => {
            let m = quantize(&Scheme::Int8, w, out, inp)?;
            let a = affine(&m)?;
            let parts = ct_scheme(layout).pack_int(module, &int_codes(&a, &m, HfDtype::F32));
            Ok((parts.unwrap_or_default(), m.dequantize()))
        }
        HfLayout::CtFp8 { .. } | HfLayout::CtFp8TokenGroup { .. } | HfLayout::Fp8 { block: None } => {
            let per_tensor = matches!(layout, HfLayout::Fp8 { .. });
            let m = quantize(&Scheme::Fp8 { format: Fp8Format::E4M3, per_tensor }, w, out, inp)?;
            let (codes, scales) = (fp8_codes(&m), fp8_scales(&m));
            let fp8 = Fp8Codes { out, inp, format: Ofp8::E4M3, codes: &codes, scales: &scales };
            let parts = if per_tensor {
                Fp8 { fmt: Ofp8::E4M3, block: None }.pack(module, &fp8)
            } else {
                ct_scheme(layout).pack_fp8(module, &fp8).unwrap_or_default()
            };
            Ok((parts, m.dequantize()))
        }
        HfLayout::Fp8 { block: Some(b) } => Ok(pack_fp8_blocks(module, w, [out, inp], b)),
    }
}

/// GPTQ: `int8` (one group per row) or `int4-gG[-asym]` codes, act-order columns when
/// `desc_act`; the values are un-permuted back to the input order.
///
/// # Shapes
/// - `w`: `[out, inp]`; returns values `[out, inp]`.
fn pack_gptq(module: &str, w: &[f32], [out, inp]: [usize; 2], gptq: Gptq) -> Result<Packed, QuantizeError> {
    let Gptq { bits, group, desc_act, sym, .. } = gptq;
    let scheme = if bits == 8 { Scheme::Int8 } else { Scheme::Int4 { group: group.unwrap_or(inp), asym: !sym } };
    // Act order: quantize the permuted columns; column `perm[j]` falls in group `j / G`.
    let perm = if desc_act { act_order_perm(inp) } else { (0..inp).collect() };
    let permuted: Vec<f32> = (0..out * inp).map(|k| w[(k / inp) * inp + perm[k % inp]]).collect();
    let m = quantize(&scheme, &permuted, out, inp)?;
    let a = affine(&m)?;
    let parts = gptq.pack(module, &int_codes(&a, &m, int_scale_dtype(bits)), &perm);
    let d = m.dequantize();
    let mut values = vec![0f32; out * inp];
    for (j, &i) in perm.iter().enumerate() {
        for o in 0..out {
            values[o * inp + i] = d[o * inp + j];
        }
    }
    Ok((parts, values))
}

/// `quant_method: fp8` with `b × b` blocks: scale `amax / 448` per block, E4M3 codes.
///
/// # Shapes
/// - `w`: `[out, inp]`; returns values `[out, inp]`.
fn pack_fp8_blocks(module: &str, w: &[f32], [out, inp]: [usize; 2], b: usize) -> Packed {
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
    let fp8 = Fp8Codes { out, inp, format: Ofp8::E4M3, codes: &codes, scales: &scales };
    (Fp8 { fmt: Ofp8::E4M3, block: Some((b, b)) }.pack(module, &fp8), values)
}

/// The compressed-tensors scheme of a `Ct*` layout (GPTQ, AWQ and FP8 layouts get a scheme they
/// do not use).
fn ct_scheme(layout: HfLayout) -> CtScheme {
    let channel = |bits, float| CtWeights { bits, float, symmetric: true, strategy: Strategy::Channel };
    let token =
        |float, on: bool| on.then_some(CtActivations { bits: 8, float, granularity: ActivationGranularity::Token });
    match layout {
        HfLayout::CtPacked { bits: 8, .. } => {
            CtScheme { format: CtFormat::Packed, weights: channel(8, false), activations: None }
        }
        HfLayout::CtPacked { bits, group, asym } => CtScheme {
            format: CtFormat::Packed,
            weights: CtWeights { bits, float: false, symmetric: !asym, strategy: Strategy::Group(group) },
            activations: None,
        },
        HfLayout::CtInt8 { activations } => {
            CtScheme { format: CtFormat::Int, weights: channel(8, false), activations: token(false, activations) }
        }
        HfLayout::CtFp8TokenGroup { group } => CtScheme {
            format: CtFormat::Float,
            weights: channel(8, true),
            activations: Some(CtActivations {
                bits: 8,
                float: true,
                granularity: ActivationGranularity::TokenGroup(group),
            }),
        },
        HfLayout::CtFp8 { activations } => {
            CtScheme { format: CtFormat::Float, weights: channel(8, true), activations: token(true, activations) }
        }
        HfLayout::Gptq { .. } | HfLayout::Awq { .. } | HfLayout::Fp8 { .. } => {
            CtScheme { format: CtFormat::Float, weights: channel(8, true), activations: None }
        }
    }
}

/// The compressed-tensors scheme that stores a qdrift FP4 scheme's parts as they are, and its
/// group size: `nvfp4` as `nvfp4-pack-quantized` (`tensor_group` of 16), `mxfp4-ct` and
/// `mxfp4-ocp` as `mxfp4-pack-quantized` (groups of 32; the layout stores any E8M0 codes, so
/// both scale rules load the same way). `None` for every other scheme.
pub(crate) fn ct_fp4_scheme(scheme: &Scheme) -> Option<(CtScheme, usize)> {
    let (format, group) = match scheme {
        Scheme::Nvfp4 => (CtFormat::Nvfp4, 16),
        Scheme::Mxfp4 { .. } => (CtFormat::Mxfp4, 32),
        _ => return None,
    };
    let weights = CtWeights { bits: 4, float: true, symmetric: true, strategy: Strategy::Group(group) };
    Some((CtScheme { format, weights, activations: None }, group))
}

/// Whether [`crate::write_compressed_tensors`] writes `scheme` (`nvfp4`, `mxfp4-ct`,
/// `mxfp4-ocp`).
pub fn writes_compressed_tensors(scheme: &Scheme) -> bool {
    ct_fp4_scheme(scheme).is_some()
}

/// `quantization_config` for `layout`, as JSON text (written by the layout's own code in
/// `qdrift-load`).
fn quantization_config(layout: HfLayout) -> String {
    match layout {
        HfLayout::Gptq { bits, group, asym, act_order, v2 } => {
            Gptq { bits, group, desc_act: act_order, sym: !asym, v2 }.quantization_config()
        }
        HfLayout::Awq { group } => Awq { group: Some(group) }.quantization_config(),
        HfLayout::Fp8 { block } => Fp8 { fmt: Ofp8::E4M3, block: block.map(|b| (b, b)) }.quantization_config(),
        HfLayout::CtPacked { .. }
        | HfLayout::CtInt8 { .. }
        | HfLayout::CtFp8 { .. }
        | HfLayout::CtFp8TokenGroup { .. } => Compressed {
            groups: vec![CtGroup { targets: vec!["Linear".to_string()], scheme: ct_scheme(layout) }],
            ignore: vec!["lm_head".to_string()],
        }
        .quantization_config(),
    }
}
