//! [`TokenEmbedding`]: a model's token embedding table, `[vocab, dim]`, held as consecutive row
//! ranges where one table would pass the device's largest buffer (Mesa's lavapipe allows 128 MiB
//! in one: less than Llama-3.2-1B's 525 MB f16 table).

use burn::module::{Module, Param};
use burn::tensor::{DType, Device, Int, Tensor};

use crate::linear::rows_per_buffer;
use crate::tensors::{host_f32, upload};

/// The token embedding table as row ranges `[rows_i, dim]`, in order; one range unless the
/// device's largest buffer is smaller than the table.
#[derive(Module, Debug)]
pub struct TokenEmbedding {
    /// Rows `0..rows_0`.
    first: Param<Tensor<2>>,
    /// The ranges after it, in order.
    rest: Vec<Param<Tensor<2>>>,
}

impl TokenEmbedding {
    /// The `[vocab, dim]` row-major table `table` in `dtype` on `device`, each range within
    /// `max_buffer_bytes` (`None`: one range).
    pub(crate) fn new(
        table: &[f32],
        [vocab, dim]: [usize; 2],
        dtype: DType,
        device: &Device,
        max_buffer_bytes: Option<u64>,
    ) -> Self {
        let per_part = rows_per_buffer(vocab, dim, dtype, max_buffer_bytes);
        let range = |lo: usize| {
            let hi = (lo + per_part).min(vocab);
            Param::from_tensor(upload(&table[lo * dim..hi * dim], [hi - lo, dim], dtype, device))
        };
        Self { first: range(0), rest: (per_part..vocab).step_by(per_part).map(range).collect() }
    }

    fn parts_iter(&self) -> impl Iterator<Item = &Param<Tensor<2>>> {
        std::iter::once(&self.first).chain(&self.rest)
    }

    /// `[vocab, dim]`.
    pub fn dims(&self) -> [usize; 2] {
        [self.parts_iter().map(|p| p.dims()[0]).sum(), self.first.dims()[1]]
    }

    /// The dtype the table is stored in.
    pub fn dtype(&self) -> DType {
        self.first.val().dtype()
    }

    /// The device holding the table.
    pub fn device(&self) -> Device {
        self.first.val().device()
    }

    /// How many row ranges hold the table.
    pub fn parts(&self) -> usize {
        1 + self.rest.len()
    }

    /// The rows of `tokens`, in the stored dtype. Over several ranges, each range selects its
    /// rows (indices clamped into it) and keeps them where the token falls in it: a selection,
    /// never arithmetic on the values, so the rows are exactly the table's.
    ///
    /// # Shapes
    /// - `tokens`: `[n]`, each below `vocab` → `[n, dim]`
    pub fn select(&self, tokens: Tensor<1, Int>) -> Tensor<2> {
        let (first, rest) = (&self.first, &self.rest);
        if rest.is_empty() {
            return first.val().select(0, tokens);
        }
        let [n] = tokens.dims();
        let in_range = |lo: usize, rows: usize| {
            let local = tokens.clone().sub_scalar(lo as i64).clamp(0, rows as i64 - 1);
            let inside =
                tokens.clone().greater_equal_elem(lo as i64).bool_and(tokens.clone().lower_elem((lo + rows) as i64));
            (local, inside)
        };
        let rows = first.dims()[0];
        let mut x = first.val().select(0, in_range(0, rows).0);
        let dim = x.dims()[1];
        let mut lo = rows;
        for part in rest {
            let rows = part.dims()[0];
            let (local, inside) = in_range(lo, rows);
            let mask = inside.unsqueeze_dim::<2>(1).expand([n, dim]);
            x = x.mask_where(mask, part.val().select(0, local));
            lo += rows;
        }
        x
    }

    /// The table as host values, `[vocab, dim]` row-major, exactly as stored.
    pub fn host_values(&self) -> Vec<f32> {
        self.parts_iter().flat_map(|p| host_f32(p.val())).collect()
    }
}
