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
/// `head_dim` must be even (RoPE rotates pairs). [`rotate_half_row_order_partial`] with
/// `rotary_dim = head_dim`.
pub fn rotate_half_row_order(n_heads: usize, head_dim: usize) -> Vec<usize> {
    rotate_half_row_order_partial(n_heads, head_dim, head_dim)
}

/// [`rotate_half_row_order`] for partial rotary (Phi-3's `partial_rotary_factor`): RoPE rotates
/// the first `rotary_dim` rows of each head only, so only they are permuted
/// (`order[h·head_dim + a·rotary_dim/2 + i] = h·head_dim + 2i + a`); rows `rotary_dim..head_dim`
/// of a head stay where they are in both layouts (`transformers`' `apply_rotary_pos_emb` of
/// `Phi3Attention` passes `q[..., rotary_dim:]` through). `rotary_dim` must be even and at most
/// `head_dim`.
pub fn rotate_half_row_order_partial(n_heads: usize, head_dim: usize, rotary_dim: usize) -> Vec<usize> {
    let half = rotary_dim / 2;
    (0..n_heads)
        .flat_map(|h| {
            let rotated = (0..2).flat_map(move |a| (0..half).map(move |i| h * head_dim + 2 * i + a));
            rotated.chain((2 * half..head_dim).map(move |r| h * head_dim + r))
        })
        .collect()
}

/// Which way [`permute_rows`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RopeLayout {
    /// Rotate-half rows in, interleaved rows out (readers of HF folders and GGUF `qwen2`).
    ToInterleaved,
    /// Interleaved rows in, rotate-half rows out (writers).
    ToRotateHalf,
}

/// Rows of `t` permuted between the two layouts, `n_heads` heads of `rows / n_heads` rows each,
/// all of them rotated: [`permute_head_rows`] with `rotary_dim` = the head's rows.
///
/// # Shapes
/// - `t`: `[rows, cols]` (a weight) or `[rows]` (a bias); the result has the same shape.
pub(crate) fn permute_rows(t: &HostTensor, n_heads: usize, to: RopeLayout) -> HostTensor {
    let head_dim = t.shape.first().copied().unwrap_or(0) / n_heads.max(1);
    permute_head_rows(t, n_heads, head_dim, to)
}

/// Rows of `t` permuted between the two layouts, `n_heads` heads of `rows / n_heads` rows each of
/// which RoPE rotates the first `rotary_dim`: [`RopeLayout::ToInterleaved`] puts rotate-half row
/// `r` at `order[r]`; [`RopeLayout::ToRotateHalf`] moves interleaved row `order[r]` to row `r`
/// (`order` from [`rotate_half_row_order_partial`]). A q/k norm weight `[head_dim]` is one head.
///
/// # Shapes
/// - `t`: `[rows, cols]` (a weight) or `[rows]` (a bias, a q/k norm); the result has the same shape.
pub(crate) fn permute_head_rows(t: &HostTensor, n_heads: usize, rotary_dim: usize, to: RopeLayout) -> HostTensor {
    let rows = t.shape.first().copied().unwrap_or(0);
    reorder_rows(t, &rotate_half_row_order_partial(n_heads, rows / n_heads.max(1), rotary_dim), to)
}

/// `t`'s rows moved between the two layouts by a row order from [`rotate_half_row_order_partial`]:
/// [`RopeLayout::ToInterleaved`] puts row `r` at `order[r]`; [`RopeLayout::ToRotateHalf`] moves
/// row `order[r]` to row `r`. For callers that reuse one order (GGUF's stored block rows).
///
/// # Shapes
/// - `t`: `[rows, cols]` or `[rows]`, `rows = order.len()`; the result has `t`'s shape.
pub(crate) fn reorder_rows(t: &HostTensor, order: &[usize], to: RopeLayout) -> HostTensor {
    let cols = t.data.len() / order.len().max(1);
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

    #[test]
    fn partial_rotary_permutes_the_rotated_rows_of_each_head_only() {
        // Phi-3's tiny shape: head_dim 16, rotary_dim 12: pairs (j, j+6) for j < 6, rows 12..16 stay.
        let (heads, hd, rot) = (2, 16, 12);
        let order = rotate_half_row_order_partial(heads, hd, rot);
        for h in 0..heads {
            for i in 0..rot / 2 {
                for a in 0..2 {
                    assert_eq!(order[h * hd + a * rot / 2 + i], h * hd + 2 * i + a);
                }
            }
            for r in rot..hd {
                assert_eq!(order[h * hd + r], h * hd + r);
            }
        }
        assert_eq!(rotate_half_row_order_partial(3, 8, 8), rotate_half_row_order(3, 8));
        // Rotate-half row 1 of head 0 (pair (1, 7)'s first) lands at interleaved row 2; row 13 stays.
        let t = HostTensor { shape: vec![32], data: (0..32).map(|r| r as f32).collect() };
        let inter = permute_head_rows(&t, heads, rot, RopeLayout::ToInterleaved);
        assert_eq!(&inter.data[..16], &[0., 6., 1., 7., 2., 8., 3., 9., 4., 10., 5., 11., 12., 13., 14., 15.]);
        assert_eq!(inter.data[16], 16.0);
        assert_eq!(inter.data[17], 22.0);
        assert_eq!(permute_head_rows(&inter, heads, rot, RopeLayout::ToRotateHalf), t);
        // A q/k norm weight is one head.
        let norm = HostTensor { shape: vec![4], data: vec![0., 1., 2., 3.] };
        assert_eq!(permute_head_rows(&norm, 1, 4, RopeLayout::ToInterleaved).data, [0., 2., 1., 3.]);
    }
}
