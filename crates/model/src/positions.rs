//! [`Positions`]: how a batch of prompts of different lengths is laid out (left-padded), which
//! keys each query sees, and the masks and positions that follow from it.

use burn::tensor::{Bool, DType, Device, Tensor, TensorData};

/// Which keys a layer's queries see within their causal context: those of a sliding window, those
/// of their own chunk (Llama 4's chunked attention), or all (the default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Span {
    /// Sliding window: the keys at positions `q − window < k ≤ q`.
    pub window: Option<usize>,
    /// Chunk: the keys at positions `k ≤ q` with `⌊k / chunk⌋ = ⌊q / chunk⌋`.
    pub chunk: Option<usize>,
}

/// Where each row of a batch starts: prompts of different lengths are left-padded so that they
/// all end in the same column, and every row counts its positions from its own first token.
///
/// Column `c` of row `b` holds position `c - pad[b]`; columns before `pad[b]` are padding, never
/// attended to by the row's real tokens, so a row's results do not depend on its neighbours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Positions {
    /// Left padding of each row.
    pub pad: Vec<usize>,
}

impl Positions {
    /// The layout for prompts of these lengths, padded to the longest.
    pub fn left_padded(lengths: &[usize]) -> Self {
        let longest = lengths.iter().copied().max().unwrap_or(0);
        Self { pad: lengths.iter().map(|l| longest - l).collect() }
    }

    /// Rotary positions of columns `start..start + len`, one row per batch row.
    pub(crate) fn rows(&self, start: usize, len: usize) -> Vec<Vec<usize>> {
        self.pad.iter().map(|&p| (start..start + len).map(|c| c.saturating_sub(p)).collect()).collect()
    }

    /// The key columns the query in column `column` of row `row` attends to: its row's real
    /// tokens up to itself (causal, not padding). A padding query sees itself only, which keeps
    /// its softmax finite; its output is never used.
    pub(crate) fn visible(&self, row: usize, column: usize) -> std::ops::Range<usize> {
        let p = self.pad[row];
        if column >= p { p..column + 1 } else { column..column + 1 }
    }

    /// [`Positions::visible`] within a sliding window of `window` positions (`None`: the whole
    /// causal context): the keys at positions `q − window < k ≤ q` (`transformers`'
    /// `sliding_window_overlay`; a key exactly `window` behind is not visible). Positions and
    /// columns differ by the row's padding only, so the window counts columns.
    pub(crate) fn visible_within(&self, row: usize, column: usize, window: Option<usize>) -> std::ops::Range<usize> {
        let r = self.visible(row, column);
        match window {
            Some(w) => r.start.max((column + 1).saturating_sub(w))..r.end,
            None => r,
        }
    }

    /// [`Positions::visible_within`] `span`'s window, and within the query's own chunk where `span`
    /// chunks: the keys at positions `k ≤ q` with `⌊k / chunk⌋ = ⌊q / chunk⌋`
    /// (`transformers`' `chunked_overlay`, which counts positions from the row's left padding).
    pub(crate) fn visible_span(&self, row: usize, column: usize, span: Span) -> std::ops::Range<usize> {
        let r = self.visible_within(row, column, span.window);
        let p = self.pad[row];
        match span.chunk {
            Some(c) if column >= p => r.start.max(p + (column - p) / c * c)..r.end,
            _ => r,
        }
    }

    /// 1 for the real tokens in columns `start..start + len` and 0 for padding.
    ///
    /// # Shapes
    /// - returns `[batch, len, 1]`, f32
    pub(crate) fn real(&self, start: usize, len: usize, device: &Device) -> Tensor<3> {
        let m: Vec<f32> =
            self.pad.iter().flat_map(|&p| (start..start + len).map(move |c| if c >= p { 1.0 } else { 0.0 })).collect();
        Tensor::from_data(TensorData::new(m, [self.pad.len(), len, 1]), (device, DType::F32))
    }

    /// The additive attention mask for queries in columns `start..start + len` over keys in
    /// columns `0..start + len`: 0 where [`Positions::visible_span`] `span` (the default:
    /// causal), −∞ elsewhere.
    ///
    /// # Shapes
    /// - returns `[batch, 1, 1, len, start + len]`, f32
    pub(crate) fn window_mask(&self, start: usize, len: usize, span: Span, device: &Device) -> Tensor<5> {
        let keys = start + len;
        let mut m = Vec::with_capacity(self.pad.len() * len * keys);
        for row in 0..self.pad.len() {
            for q in start..start + len {
                let visible = self.visible_span(row, q, span);
                m.extend((0..keys).map(|k| if visible.contains(&k) { 0.0f32 } else { f32::NEG_INFINITY }));
            }
        }
        Tensor::from_data(TensorData::new(m, [self.pad.len(), 1, 1, len, keys]), (device, DType::F32))
    }

    /// [`Positions::window_mask`] as the boolean mask Burn's attention op takes (`true` where a
    /// key is hidden), for queries grouped as the fused path lays them out: the `rep` query heads
    /// sharing each of `kv_heads` key/value heads, each with the `len` new columns. Built whole
    /// on the host: the op reads a mask of the scores' own shape.
    ///
    /// # Shapes
    /// - returns `[batch, kv_heads, rep * len, start + len]`
    pub(crate) fn grouped_hidden(
        &self,
        (start, len): (usize, usize),
        span: Span,
        [kv_heads, rep]: [usize; 2],
        device: &Device,
    ) -> Tensor<4, Bool> {
        let keys = start + len;
        let mut m = Vec::with_capacity(self.pad.len() * kv_heads * rep * len * keys);
        for row in 0..self.pad.len() {
            let rows: Vec<bool> = (start..start + len)
                .flat_map(|q| {
                    let visible = self.visible_span(row, q, span);
                    (0..keys).map(move |k| !visible.contains(&k))
                })
                .collect();
            for _ in 0..kv_heads * rep {
                m.extend_from_slice(&rows);
            }
        }
        Tensor::from_data(TensorData::new(m, [self.pad.len(), kv_heads, rep * len, keys]), device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window of 3 sees the keys at distances 0, 1 and 2 (`q − window < k ≤ q`), never
    /// padding, and a padding query sees itself.
    #[test]
    fn a_window_sees_distances_below_it() {
        let p = Positions { pad: vec![0, 4] };
        assert_eq!(p.visible_within(0, 6, Some(3)), 4..7);
        assert_eq!(p.visible_within(0, 1, Some(3)), 0..2);
        assert_eq!(p.visible_within(0, 6, None), 0..7);
        assert_eq!(p.visible_within(1, 5, Some(3)), 4..6, "not the padding before column 4");
        assert_eq!(p.visible_within(1, 7, Some(3)), 5..8);
        assert_eq!(p.visible_within(1, 2, Some(3)), 2..3, "a padding query sees itself");
    }

    /// Chunks of 4 count positions from each row's first real token: position 5 sees positions
    /// 4 and 5, position 3 sees 0..=3; a padding query sees itself.
    #[test]
    fn a_chunk_sees_its_own_chunk_up_to_the_query() {
        let p = Positions { pad: vec![0, 2] };
        let chunk = Span { window: None, chunk: Some(4) };
        assert_eq!(p.visible_span(0, 5, chunk), 4..6);
        assert_eq!(p.visible_span(0, 3, chunk), 0..4);
        assert_eq!(p.visible_span(0, 4, chunk), 4..5);
        assert_eq!(p.visible_span(1, 7, chunk), 6..8, "position 5 of row 1 is column 7");
        assert_eq!(p.visible_span(1, 5, chunk), 2..6, "position 3 sees from column 2 on");
        assert_eq!(p.visible_span(1, 1, chunk), 1..2, "a padding query sees itself");
    }
}
