//! The [`Format`] trait: everything qdrift knows about one weight format, implemented once per
//! file in `formats/` and registered in `formats/mod.rs`'s `FORMATS` table.
//!
//! **Why a trait object and a static table.** A format is a unit struct implementing [`Format`];
//! the registry is `&[&dyn Format]`, so adding one is a file and a line, with no `match` to
//! extend anywhere else. [`crate::Scheme`] stays the public value type (it is copied, hashed
//! and built by callers with its parameters, `Scheme::Int4 { group, asym }`); every method of a
//! scheme asks the one format that [`Format::owns`] it. The packed matrix a format produces is a
//! [`Packed`] trait object inside [`crate::QuantizedMatrix`], so the matrix's dispatch is the
//! format's too.
//!
//! **What a format must and may say.** Required: which schemes are its own and which of them the
//! CLI lists (its grammar), their names and `describe` sentences, the bytes a matrix of a shape
//! stores, and the quantizer, whose [`Packed`] storage dequantizes, counts its bytes and lists
//! its [`crate::PackedPart`]s. Optional, with defaults that say "no": a check that refuses a
//! hand-built scheme ([`Format::check_usable`]) and whether a GGUF file can hold the scheme as
//! quantized ([`Format::gguf_storable`]; the packed storage then gives the ggml type and
//! bytes). Export facts stay plain data (a ggml type, an integer layout's codes): the writers
//! themselves are in `qdrift-quantize`.
//!
//! **Scales at two levels.** Nothing here assumes one scale per group: a block format with a
//! second-level scale (NVFP4: E2M1 codes, an E4M3 scale per 16 values and an f32 scale per
//! tensor) keeps all three in its packed struct, counts them in `storage_bytes` and lists them
//! as three parts.

use crate::error::QuantizeError;
use crate::packed::Packed;
use crate::scheme::Scheme;

/// One weight format: a family of [`Scheme`]s sharing one codec (`fp16`/`bf16`,
/// `int8`/`int4-g*`, ...). See the module doc for what each method owns.
pub(crate) trait Format: Sync {
    /// Whether `scheme` is one of this format's. Exactly one registered format owns each
    /// variant of [`Scheme`] (tested in `formats/mod.rs`).
    fn owns(&self, scheme: &Scheme) -> bool;

    /// This format's schemes that have a CLI name, in the order `--help` lists them;
    /// [`Scheme::all`] is these lists in registry order.
    fn listed(&self) -> Vec<Scheme>;

    /// The CLI name of one of this format's schemes (what [`std::fmt::Display`] prints).
    fn name(&self, scheme: &Scheme) -> String;

    /// The scheme a CLI name stands for, if it is one of this format's listed names. The
    /// default parses exactly the names [`Format::listed`] prints, so every name round-trips.
    fn parse(&self, name: &str) -> Option<Scheme> {
        self.listed().into_iter().find(|scheme| self.name(scheme) == name)
    }

    /// One sentence for `--help` ([`Scheme::describe`]).
    fn describe(&self, scheme: &Scheme) -> &'static str;

    /// Refuses a hand-built scheme the codec cannot run (a zero group size, a read-only type);
    /// every listed scheme passes.
    ///
    /// # Errors
    /// The format's reason, as [`Scheme::check_usable`] documents.
    fn check_usable(&self, _scheme: &Scheme) -> Result<(), QuantizeError> {
        Ok(())
    }

    /// Bytes stored for a `[rows, cols]` matrix, exactly [`Packed::storage_bytes`] of any such
    /// matrix quantized with `scheme` (called after [`Format::check_usable`] passed).
    fn storage_bytes(&self, scheme: &Scheme, rows: u64, cols: u64) -> u64;

    /// Quantizes a matrix whose shape and finiteness [`crate::quantize`] has checked, with a
    /// scheme that passed [`Format::check_usable`].
    ///
    /// # Shapes
    /// - `weights`: `[rows, cols]` row-major; groups and blocks run along a row.
    ///
    /// # Errors
    /// The codec's own (a scale that overflows its storage type).
    fn quantize(
        &self,
        scheme: &Scheme,
        weights: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<Box<dyn Packed>, QuantizeError>;

    /// Whether a GGUF file can hold this scheme's matrices as quantized (its packed storage
    /// then answers [`Packed::stored`] and [`Packed::gguf_bytes`]).
    fn gguf_storable(&self, _scheme: &Scheme) -> bool {
        false
    }
}
