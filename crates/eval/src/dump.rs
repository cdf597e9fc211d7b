//! The optional log-probability dump (`--dump-logprobs`): both models' full log-probabilities at
//! every teacher-forced position of the reference's text, so that the report's metrics can be
//! recomputed independently.
//!
//! **Invariant: the file appears complete or not at all (written to a temporary file, renamed
//! into place at the end); lines are in prompt order because the evaluation runs one batch at a
//! time when dumping.**

use std::io::Write;
use std::path::{Path, PathBuf};

use burn::tensor::Tensor;

use crate::error::EvalError;

/// JSONL, one line per (variant, prompt, position).
pub(crate) struct Dump {
    path: PathBuf,
    tmp: PathBuf,
    out: std::io::BufWriter<std::fs::File>,
}

impl Dump {
    /// Starts the dump that will end up at `path`.
    pub fn create(path: &Path) -> Result<Dump, EvalError> {
        let tmp = path.with_extension("jsonl.tmp");
        let file = std::fs::File::create(&tmp).map_err(EvalError::io(&tmp))?;
        Ok(Dump { path: path.to_path_buf(), tmp, out: std::io::BufWriter::new(file) })
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
            writeln!(self.out, "{line}").map_err(EvalError::io(&self.tmp))?;
        }
        Ok(())
    }

    /// Flushes the dump and moves it into place.
    pub fn finish(mut self) -> Result<(), EvalError> {
        self.out.flush().map_err(EvalError::io(&self.tmp))?;
        std::fs::rename(&self.tmp, &self.path).map_err(EvalError::io(&self.path))
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
