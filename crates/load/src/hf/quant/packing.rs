//! What the layouts share, both ways: codes in bit fields of `i32` words ([`field`], [`put`]),
//! the group of each input ([`group_index`]), scale grids ([`Strategy`]), and the writer's side:
//! the codes a quantizer hands over ([`IntCodes`], [`Fp8Codes`]) and the tensors a layout packs
//! them into ([`HfTensor`]).

use std::path::Path;

use crate::LoadError;
use crate::hf::shards::Shards;
use crate::ofp8::Ofp8;

/// Unsigned `bits`-wide field `k` of `word` (low bits first).
pub(crate) fn field(word: i32, bits: u32, k: usize) -> i32 {
    ((word as u32 >> (bits as usize * k)) & ((1u32 << bits) - 1)) as i32
}

/// ORs `value` (masked to `bits` bits) into field `k` of `word` (low bits first): the inverse of
/// [`field`].
pub(crate) fn put(word: &mut i32, bits: u32, k: usize, value: i32) {
    let mask = (1u32 << bits) - 1;
    *word = (*word as u32 | ((value as u32 & mask) << (bits as usize * k))) as i32;
}

/// A group size in a format's name: `g128`, or `per channel` for one group per row.
pub(crate) fn group_name(group: Option<usize>) -> String {
    group.map_or_else(|| "per channel".to_string(), |g| format!("g{g}"))
}

/// Refuses a dimension that is not a whole number of `pack` values.
pub(crate) fn check_divides(
    shards: &Shards,
    tensor: &str,
    what: &str,
    dim: usize,
    pack: usize,
) -> Result<(), LoadError> {
    if dim.is_multiple_of(pack) {
        return Ok(());
    }
    Err(LoadError::invalid(
        shards.path_of(tensor).unwrap_or(Path::new(".")),
        format!("tensor {tensor}: {what} {dim} is not a multiple of the {pack} codes an int32 packs"),
    ))
}

/// The number of groups and the group of each input: `g_idx` when stored, else `i / group`.
pub(crate) fn group_index(
    shards: &Shards,
    g_idx_name: &str,
    group: Option<usize>,
    inp: usize,
) -> Result<(usize, Vec<usize>), LoadError> {
    let size = group.unwrap_or(inp).max(1);
    let n_groups = inp.div_ceil(size);
    if !shards.has(g_idx_name) {
        return Ok((n_groups, (0..inp).map(|i| i / size).collect()));
    }
    let g_idx = shards.ints(g_idx_name, &[inp])?;
    let path = shards.path_of(g_idx_name).unwrap_or(Path::new("."));
    let idx = g_idx
        .iter()
        .enumerate()
        .map(|(i, &g)| {
            usize::try_from(g).ok().filter(|&g| g < n_groups).ok_or_else(|| {
                LoadError::invalid(path, format!("tensor {g_idx_name}[{i}] = {g} is not a group in 0..{n_groups}"))
            })
        })
        .collect::<Result<_, _>>()?;
    Ok((n_groups, idx))
}

/// Which weights share a scale (and zero point): compressed-tensors' `strategy`, and the scale
/// grids of `quant_method: fp8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// One scale for the whole matrix.
    Tensor,
    /// One scale per row (output).
    Channel,
    /// Groups of this many consecutive inputs of a row.
    Group(usize),
    /// Blocks of `(rows, cols)`.
    Block(usize, usize),
}

/// The scale (and zero point) grid of a compressed-tensors or FP8 weight.
///
/// # Shapes
/// `[out, inp]` weights; the grid is `[rows, cols]` as returned by [`Strategy::grid`].
impl Strategy {
    /// The `[rows, cols]` grid of scales of an `[out, inp]` weight.
    pub fn grid(self, out: usize, inp: usize) -> (usize, usize) {
        match self {
            Strategy::Tensor => (1, 1),
            Strategy::Channel => (out, 1),
            Strategy::Group(g) => (out, inp.div_ceil(g)),
            Strategy::Block(r, c) => (out.div_ceil(r), inp.div_ceil(c)),
        }
    }

    /// Index into the `[rows, cols]` grid of weight `(o, i)`; `g_idx` replaces `i / g` for
    /// act-order groups.
    pub(crate) fn index(self, o: usize, i: usize, cols: usize, g_idx: Option<&[usize]>) -> usize {
        match self {
            Strategy::Tensor => 0,
            Strategy::Channel => o,
            Strategy::Group(g) => o * cols + g_idx.map_or(i / g, |x| x[i]),
            Strategy::Block(r, c) => (o / r) * cols + i / c,
        }
    }

    /// The scale shapes a checkpoint may store for this grid.
    pub(crate) fn scale_shapes(self, out: usize, inp: usize) -> Vec<Vec<usize>> {
        let (r, c) = self.grid(out, inp);
        match self {
            Strategy::Tensor => vec![vec![1], vec![], vec![1, 1]],
            Strategy::Channel => vec![vec![out, 1], vec![out]],
            _ => vec![vec![r, c]],
        }
    }
}

/// Element type of a packed tensor, named as safetensors names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HfDtype {
    /// `I8`.
    I8,
    /// `U8` (packed FP4 codes, E8M0 scales).
    U8,
    /// `I32` (packed words, `g_idx`).
    I32,
    /// `I64` (`weight_shape`).
    I64,
    /// `F16`.
    F16,
    /// `F32`.
    F32,
    /// `F8_E4M3`.
    F8E4M3,
    /// `F8_E5M2`.
    F8E5M2,
}

/// One tensor of a packed linear layer, ready to be written to a safetensors file.
#[derive(Debug, Clone, PartialEq)]
pub struct HfTensor {
    /// Full Hugging Face name (`model.layers.0.self_attn.q_proj.qweight`).
    pub name: String,
    /// Element type.
    pub dtype: HfDtype,
    /// Shape in elements.
    pub shape: Vec<usize>,
    /// Little-endian contents.
    pub bytes: Vec<u8>,
}

impl HfTensor {
    /// `values` as I32.
    pub(crate) fn i32(name: String, shape: Vec<usize>, values: &[i32]) -> Self {
        HfTensor { name, dtype: HfDtype::I32, shape, bytes: values.iter().flat_map(|x| x.to_le_bytes()).collect() }
    }

    /// `values` as F16 (round-to-nearest-even) or F32; any other `dtype` is taken as F32.
    pub(crate) fn floats(name: String, dtype: HfDtype, shape: Vec<usize>, values: &[f32]) -> Self {
        let (dtype, bytes) = match dtype {
            HfDtype::F16 => (dtype, values.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect()),
            _ => (HfDtype::F32, values.iter().flat_map(|x| x.to_le_bytes()).collect()),
        };
        HfTensor { name, dtype, shape, bytes }
    }
}

/// A matrix's integer codes as the integer layouts (GPTQ, AWQ, compressed-tensors' `int` formats)
/// store them: `w[o, i] = (codes[o, i] − zeros[o, g]) · scales[o, g]`, `g` the group of input `i`.
/// Codes and zero points are unsigned, in `0..2^bits` (a symmetric scheme's zero point is
/// `2^(bits−1)`); each layout re-encodes them as its format says.
///
/// # Shapes
/// - `codes`: `[out, inp]`; `zeros`, `scales`: `[out, inp.div_ceil(group)]`.
#[derive(Debug, Clone, Copy)]
pub struct IntCodes<'a> {
    /// Rows (output features).
    pub out: usize,
    /// Columns (input features).
    pub inp: usize,
    /// Consecutive codes per group along a row (`inp` for one group per row).
    pub group: usize,
    /// Unsigned codes, row-major.
    pub codes: &'a [i32],
    /// Unsigned zero points, one per row and group.
    pub zeros: &'a [i32],
    /// Scales, one per row and group.
    pub scales: &'a [f32],
    /// How the scales are stored: [`HfDtype::F16`] (as real checkpoints store them) or
    /// [`HfDtype::F32`] (exact for f32 scales).
    pub scale_dtype: HfDtype,
}

impl IntCodes<'_> {
    /// Groups per row.
    pub fn groups(&self) -> usize {
        self.inp.div_ceil(self.group.max(1))
    }
}

/// A matrix's FP8 codes and scales: `w[o, i] = decode(codes[o, i]) · scales[cell of (o, i)]`,
/// the cells a grid the layout declares ([`Strategy::grid`]).
///
/// # Shapes
/// - `codes`: `[out, inp]`; `scales`: the grid's `rows × cols`, row-major.
#[derive(Debug, Clone, Copy)]
pub struct Fp8Codes<'a> {
    /// Rows (output features).
    pub out: usize,
    /// Columns (input features).
    pub inp: usize,
    /// The FP8 format of the codes.
    pub format: Ofp8,
    /// FP8 codes, row-major.
    pub codes: &'a [u8],
    /// F32 scales on the layout's grid.
    pub scales: &'a [f32],
}

impl Fp8Codes<'_> {
    /// `{module}.weight`: the codes in their FP8 dtype.
    pub(crate) fn weight(&self, module: &str) -> HfTensor {
        let dtype = match self.format {
            Ofp8::E4M3 => HfDtype::F8E4M3,
            Ofp8::E5M2 => HfDtype::F8E5M2,
        };
        HfTensor {
            name: format!("{module}.weight"),
            dtype,
            shape: vec![self.out, self.inp],
            bytes: self.codes.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_low_bits_first() {
        let word = 0x7654_3210u32 as i32;
        assert_eq!((0..8).map(|k| field(word, 4, k)).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5, 6, 7]);
        let word = 0x80FF_0102u32 as i32;
        assert_eq!((0..4).map(|k| field(word, 8, k)).collect::<Vec<_>>(), [2, 1, 255, 128]);
    }

    #[test]
    fn put_is_the_inverse_of_field() {
        let mut word = 0;
        for (k, v) in [3, -1, 0, 9, 15, 16, 7, 1].into_iter().enumerate() {
            put(&mut word, 4, k, v);
        }
        assert_eq!((0..8).map(|k| field(word, 4, k)).collect::<Vec<_>>(), [3, 15, 0, 9, 15, 0, 7, 1]);
    }
}
