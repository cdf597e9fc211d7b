//! The two row orders of RoPE's q/k projections, and the permutation between them.
//!
//! RoPE rotates pairs of a head's dimensions. [`crate::HostModel`] (like llama2.c and GGUF
//! `llama`) uses the **interleaved** layout: the pairs are rows `2i` and `2i + 1` of a head.
//! Hugging Face checkpoints (and GGUF `qwen2`) use the **rotate-half** layout: the pairs are rows
//! `i` and `i + head_dim/2`. Every reader and writer of those formats goes through this module,
//! so the permutation is defined once (it is the inverse of llama.cpp `convert_hf_to_gguf.py`'s
//! `LlamaModel.permute`).

use qdrift_weights::HostTensor;

/// For a q or k projection of `n_heads` heads with `head_dim` rows each, in the interleaved
/// RoPE layout, the interleaved row that each rotate-half row comes from:
/// `order[h·head_dim + a·head_dim/2 + i] = h·head_dim + 2i + a` for `a ∈ {0, 1}`.
///
/// Rotate-half row `r` of a written matrix is interleaved row `order[r]`; to read a
/// rotate-half matrix back into the interleaved layout, put its row `r` at row `order[r]`.
/// `head_dim` must be even (RoPE rotates pairs).
pub fn rotate_half_row_order(n_heads: usize, head_dim: usize) -> Vec<usize> {
    let half = head_dim / 2;
    (0..n_heads).flat_map(|h| (0..2).flat_map(move |a| (0..half).map(move |i| h * head_dim + 2 * i + a))).collect()
}

/// Which way [`permute_rows`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RopeLayout {
    /// Rotate-half rows in, interleaved rows out (readers of HF folders and GGUF `qwen2`).
    ToInterleaved,
    /// Interleaved rows in, rotate-half rows out (writers).
    ToRotateHalf,
}

/// Rows of `t` permuted between the two layouts, `n_heads` heads of `rows / n_heads` rows each:
/// [`RopeLayout::ToInterleaved`] puts rotate-half row `r` at `order[r]`; [`RopeLayout::ToRotateHalf`]
/// moves interleaved row `order[r]` to row `r` (`order` from [`rotate_half_row_order`]).
///
/// # Shapes
/// - `t`: `[rows, cols]` (a weight) or `[rows]` (a bias); the result has the same shape.
pub(crate) fn permute_rows(t: &HostTensor, n_heads: usize, to: RopeLayout) -> HostTensor {
    let rows = t.shape[0];
    let cols = t.data.len() / rows.max(1);
    let order = rotate_half_row_order(n_heads, rows / n_heads.max(1));
    let mut data = vec![0.0; t.data.len()];
    for (r, &o) in order.iter().enumerate() {
        let (dst, src) = match to {
            RopeLayout::ToInterleaved => (o, r),
            RopeLayout::ToRotateHalf => (r, o),
        };
        data[dst * cols..(dst + 1) * cols].copy_from_slice(&t.data[src * cols..(src + 1) * cols]);
    }
    HostTensor { shape: t.shape.clone(), data }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_order_is_the_inverse_of_llama_cpp_permute() {
        // One head of 4: interleaved pairs (0,1), (2,3) -> rotate-half pairs (0,2), (1,3).
        assert_eq!(rotate_half_row_order(1, 4), [0, 2, 1, 3]);
        // convert_hf_to_gguf.py permute (HF -> interleaved):
        // w.reshape(n_head, 2, hd/2, ...).swapaxes(1, 2): interleaved row h·hd + 2i + a is
        // HF row h·hd + a·hd/2 + i.
        let (heads, hd) = (3, 8);
        let order = rotate_half_row_order(heads, hd);
        for h in 0..heads {
            for i in 0..hd / 2 {
                for a in 0..2 {
                    assert_eq!(order[h * hd + a * hd / 2 + i], h * hd + 2 * i + a);
                }
            }
        }
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..heads * hd).collect::<Vec<_>>());
    }

    #[test]
    fn permute_rows_round_trips() {
        // 2 heads of 4 rows, 3 columns; each value names its row.
        let t = HostTensor { shape: vec![8, 3], data: (0..8).flat_map(|r| [r as f32; 3]).collect() };
        let half = permute_rows(&t, 2, RopeLayout::ToRotateHalf);
        let firsts: Vec<f32> = half.data.chunks(3).map(|row| row[0]).collect();
        assert_eq!(firsts, [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]);
        assert_eq!(permute_rows(&half, 2, RopeLayout::ToInterleaved), t);
    }
}
