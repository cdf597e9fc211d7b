//! The optional log-probability dump (`--dump-logprobs`): both models' full log-probabilities at
//! every teacher-forced position of the reference's text, so that the report's metrics can be
//! recomputed independently.
//!
//! **Invariant: the file appears complete or not at all (written to a temporary file beside it
//! and renamed into place at the end, [`qdrift_io::AtomicFile`]; a run that fails removes it);
//! lines are in prompt order because the evaluation runs one batch at a time when dumping.**

use std::io::Write;
use std::path::Path;

use burn::tensor::Tensor;
use qdrift_io::{AtomicFile, IoError};

use crate::error::EvalError;

/// JSONL, one line per (variant, prompt, position).
pub(crate) struct Dump {
    out: AtomicFile,
}

impl Dump {
    /// Starts the dump that will end up at `path`.
    pub fn create(path: &Path) -> Result<Dump, EvalError> {
        Ok(Dump { out: AtomicFile::create(path)? })
    }

    /// Writes one chunk of both models' logits as log-probabilities, its lines labelled with
    /// `variant`.
    pub fn write_chunk(&mut self, variant: &str, chunk: DumpChunk<'_>) -> Result<(), EvalError> {
        let DumpChunk { first_prompt, start, reference, var, tokens } = chunk;
        let [_, c, v] = reference.dims();
        let (r, q) = (host(reference)?, host(var)?);
        for (k, token) in tokens.iter().enumerate() {
            let line = serde_json::json!({
                "variant": variant,
                "prompt": first_prompt + k / c,
                "position": start + k % c,
                "token": token,
                "ref_logprobs": qdrift_score::log_softmax(&r[k * v..(k + 1) * v])?,
                "var_logprobs": qdrift_score::log_softmax(&q[k * v..(k + 1) * v])?,
            });
            writeln!(self.out, "{line}")
                .map_err(|source| IoError::Write { path: self.out.path().to_path_buf(), source })?;
        }
        Ok(())
    }

    /// Flushes the dump to disk and moves it into place.
    pub fn finish(self) -> Result<(), EvalError> {
        Ok(self.out.commit()?)
    }
}

/// One teacher-forced chunk of both models, as [`Dump::write_chunk`] takes it.
///
/// # Shapes
/// - `reference`, `var`: `[batch, chunk, vocab]`
/// - `tokens`: `batch * chunk` scored tokens, row-major
pub(crate) struct DumpChunk<'a> {
    /// The chunk's first prompt.
    pub first_prompt: usize,
    /// Its first position.
    pub start: usize,
    /// The reference's logits.
    pub reference: &'a Tensor<3>,
    /// The variant's logits.
    pub var: &'a Tensor<3>,
    /// The tokens scored.
    pub tokens: &'a [u32],
}

/// A tensor's values on the host, as f32.
fn host(t: &Tensor<3>) -> Result<Vec<f32>, EvalError> {
    t.to_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| EvalError::Internal(format!("reading logits for the dump: {e:?}")))
}
