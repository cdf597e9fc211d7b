//! The stored size of a source file's tensors per type ([`SourceStorage`]): what a GGUF file or
//! a quantized Hugging Face folder really spends per weight, for `qdrift inspect`. The readers
//! fill [`crate::LoadedModel::source_storage`] with it; [`crate::inspect`] reports it.

use std::fmt;

use serde::Serialize;

/// The stored size of a source file's tensors of one type.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TypeStorage {
    /// Type name as the file has it (`F32`, `Q4_K`, `IQ4_XS`, ...).
    pub dtype: String,
    /// Number of tensors.
    pub tensors: usize,
    /// Values in them.
    pub elements: u64,
    /// Bytes their data takes in the file (blocks, scales included; no alignment padding).
    pub bytes: u64,
    /// `8 · bytes / elements` (0 for no elements).
    pub bits_per_weight: f64,
}

/// The stored size of a source file's tensors, per type: what a mixed-precision file (llama.cpp's
/// `Q4_K_M` keeps some tensors in Q6_K, norms in F32, ...) really spends per weight.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceStorage {
    /// One entry per type, most bytes first (ties by name).
    pub by_type: Vec<TypeStorage>,
    /// Number of tensors.
    pub tensors: usize,
    /// Values in all tensors.
    pub elements: u64,
    /// Bytes of all tensors' data.
    pub bytes: u64,
    /// `8 · bytes / elements` over every tensor (0 for no elements).
    pub bits_per_weight: f64,
}

/// A figure of [`crate::inspect::inspect`] (or of [`source_storage`]) that does not fit in 64
/// bits: sizes come from files and flags, so every product and sum is checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{quantity} does not fit in 64 bits")]
pub struct SizeOverflow {
    /// The figure (`KV-cache bytes`, `parameters`, ...).
    pub quantity: &'static str,
}

/// Bits per weight, one definition wherever qdrift gives one (`inspect`, `quantize`,
/// `report.json`, the reports' glossary): `8 · bytes / elements`, the bits the weight tensors are
/// stored in over the weights they hold, as llama.cpp gives a file's; 0 for no elements.
pub fn bits_per_weight(bytes: u64, elements: u64) -> f64 {
    if elements == 0 { 0.0 } else { 8.0 * bytes as f64 / elements as f64 }
}

/// Sums tensors `(dtype, elements, bytes)` per dtype: the tensor counts, values and stored bytes of
/// each type and of the whole file, with their bits per weight. For a GGUF file, the tensors are
/// [`crate::GgufModel::tensors`] (see [`crate::inspect::gguf_source_storage`]).
///
/// # Errors
/// [`SizeOverflow`] when a sum does not fit in 64 bits (no real file comes near).
pub fn source_storage<'a>(
    tensors: impl IntoIterator<Item = (&'a str, u64, u64)>,
) -> Result<SourceStorage, SizeOverflow> {
    let overflow = |quantity| SizeOverflow { quantity };
    let mut by_type: Vec<TypeStorage> = Vec::new();
    let (mut count, mut elements, mut bytes) = (0usize, 0u64, 0u64);
    for (dtype, n, b) in tensors {
        let entry = match by_type.iter_mut().position(|t| t.dtype == dtype) {
            Some(i) => &mut by_type[i],
            None => {
                by_type.push(TypeStorage {
                    dtype: dtype.to_string(),
                    tensors: 0,
                    elements: 0,
                    bytes: 0,
                    bits_per_weight: 0.0,
                });
                by_type.last_mut().expect("just pushed")
            }
        };
        entry.tensors += 1;
        entry.elements = entry.elements.checked_add(n).ok_or(overflow("source tensor elements"))?;
        entry.bytes = entry.bytes.checked_add(b).ok_or(overflow("source tensor bytes"))?;
        count += 1;
        elements = elements.checked_add(n).ok_or(overflow("source tensor elements"))?;
        bytes = bytes.checked_add(b).ok_or(overflow("source tensor bytes"))?;
    }
    for t in &mut by_type {
        t.bits_per_weight = bits_per_weight(t.bytes, t.elements);
    }
    by_type.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.dtype.cmp(&b.dtype)));
    Ok(SourceStorage { by_type, tensors: count, elements, bytes, bits_per_weight: bits_per_weight(bytes, elements) })
}

impl fmt::Display for SourceStorage {
    /// `source storage: 4.89 bits/weight (N B for M weights)` and one line per type.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "source storage: {:.2} bits/weight ({} B for {} weights in {} tensors)",
            self.bits_per_weight,
            grouped(self.bytes),
            grouped(self.elements),
            self.tensors
        )?;
        for t in &self.by_type {
            writeln!(
                f,
                "  {:<8} {:>5} tensors {:>16} weights {:>16} B  {:>6.2} bits/weight",
                t.dtype,
                t.tensors,
                grouped(t.elements),
                grouped(t.bytes),
                t.bits_per_weight
            )?;
        }
        Ok(())
    }
}

/// `1234567` → `1,234,567`.
pub(crate) fn grouped(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{SizeOverflow, source_storage};

    #[test]
    fn source_storage_sums_per_type() {
        // A Q4_K_M-like mix: two Q4_K matrices, one Q6_K, two F32 norms.
        let tensors = [
            ("Q4_K", 4096 * 4096, 4096 * 4096 / 256 * 144),
            ("F32", 4096, 4096 * 4),
            ("Q6_K", 4096 * 4096, 4096 * 4096 / 256 * 210),
            ("Q4_K", 4096 * 11008, 4096 * 11008 / 256 * 144),
            ("F32", 4096, 4096 * 4),
        ];
        let s = source_storage(tensors).expect("fits");
        let rows: Vec<(&str, usize, u64, u64, f64)> =
            s.by_type.iter().map(|t| (t.dtype.as_str(), t.tensors, t.elements, t.bytes, t.bits_per_weight)).collect();
        assert_eq!(
            rows,
            [
                ("Q4_K", 2, 4096 * 15104, 4096 * 15104 / 256 * 144, 4.5),
                ("Q6_K", 1, 4096 * 4096, 4096 * 4096 / 256 * 210, 6.5625),
                ("F32", 2, 8192, 32768, 32.0),
            ]
        );
        assert_eq!((s.tensors, s.elements), (5, 4096 * 19200 + 8192));
        assert_eq!(s.bytes, 4096 * 15104 / 256 * 144 + 4096 * 4096 / 256 * 210 + 32768);
        assert_eq!(s.bits_per_weight, 8.0 * s.bytes as f64 / s.elements as f64);
        let text = s.to_string();
        assert!(text.starts_with("source storage: 4.94 bits/weight ("), "{text}");
        assert!(
            text.contains(
                "\n  Q6_K         1 tensors       16,777,216 weights       13,762,560 B    6.56 bits/weight\n"
            ),
            "{text}"
        );

        let empty = source_storage([]).expect("fits");
        assert_eq!((empty.tensors, empty.elements, empty.bytes, empty.bits_per_weight), (0, 0, 0, 0.0));
        assert!(empty.by_type.is_empty());
        assert_eq!(
            source_storage([("F32", u64::MAX, 4), ("F32", 1, 4)]),
            Err(SizeOverflow { quantity: "source tensor elements" })
        );
    }
}
