//! Honest timings for benchmarks (`qdrift generate --timing-json`, `qdrift bandwidth`, used by
//! `cargo xtask bench gpu`): a generation timed after an untimed warm-up, split into the first
//! token and the decode steps after it, and the device's copy bandwidth.
//!
//! The timed runs also count what a device pays for besides arithmetic: kernel launches and
//! bytes read back to the host ([`crate::count_launches`], [`crate::read_back_bytes`]), per decode
//! step as the difference between the full run and the one-token run.
//!
//! Every timer stops after the results are on the host ([`generate`] reads its tokens back;
//! [`copy_bandwidth`] waits with `Device::sync`): wgpu queues work lazily, so a timer stopped
//! earlier measures only the queueing.

use std::time::Instant;

use burn::tensor::Tensor;

use crate::counters::{Launches, count_launches, read_back_bytes};
use crate::{ComputeDevice, GenerateError, GenerationConfig, generate};
use qdrift_model::Llama;

/// How long a generation took, measured after one untimed warm-up run of the same request
/// (shader compilation and autotuning happen there, not in the numbers).
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationTiming {
    /// Prompts generated for.
    pub prompts: usize,
    /// Prompts per batch.
    pub batch_size: usize,
    /// New tokens per prompt.
    pub new_tokens: usize,
    /// Seconds of the untimed warm-up run (the whole request, plus shader compilation and, on a
    /// GPU, autotuning of every new shape unless a persisted cache has them: compare a first run
    /// with a later one).
    pub warm_up_s: f64,
    /// Seconds for the prompt pass and the first new token (a run with one new token).
    pub first_token_s: f64,
    /// Seconds for the whole request.
    pub total_s: f64,
    /// Seconds per decode step after the first token: `(total − first) / (new_tokens − 1)`;
    /// `None` for one new token, or when that is not positive (timing noise larger than the
    /// decode steps of a short request).
    pub decode_step_s: Option<f64>,
    /// Kernel launches of the one-token run (prompt pass and first token); 0 on the CPU backend.
    pub first_token_launches: u64,
    /// Kernel launches per decode step: `(full run − one-token run) / (new_tokens − 1)`; `None`
    /// for one new token.
    pub decode_step_launches: Option<f64>,
    /// The same by kernel, rounded to whole launches per kernel (a kernel launched in fewer than
    /// half the steps drops out); empty for one new token.
    pub decode_step_kernels: Launches,
    /// Bytes read back to the host per decode step (the new token ids); `None` for one new token.
    pub decode_step_read_back_bytes: Option<f64>,
}

impl GenerationTiming {
    /// New tokens per second over the whole request (prompt pass included).
    pub fn tokens_per_s(&self) -> f64 {
        (self.prompts * self.new_tokens) as f64 / self.total_s
    }

    /// New tokens per second while decoding: every prompt gains one token per decode step.
    pub fn decode_tokens_per_s(&self) -> Option<f64> {
        self.decode_step_s.map(|s| self.prompts as f64 / s)
    }
}

/// Generates as [`generate`] does, and times it: one untimed warm-up run of `config`, one run with a
/// single new token, one timed run of `config` (whose tokens are returned).
///
/// # Errors
/// [`GenerateError::Unsupported`] with `stop_at_eos` (the token count would vary) or no new tokens;
/// otherwise [`generate`]'s errors.
pub fn timed_generate(
    model: &Llama,
    device: &ComputeDevice,
    prompts: &[Vec<u32>],
    config: &GenerationConfig,
) -> Result<(Vec<Vec<u32>>, GenerationTiming), GenerateError> {
    if config.stop_at_eos.is_some() || config.max_new_tokens == 0 {
        return Err(GenerateError::Unsupported(
            "timing needs a fixed number of new tokens, at least 1 (no stop at EOS)".to_string(),
        ));
    }
    let start = Instant::now();
    generate(model, device, prompts, config, |_| {})?;
    let warm_up_s = start.elapsed().as_secs_f64();
    // One measured run: its tokens, seconds, launches and bytes read back.
    type Measured = (Vec<Vec<u32>>, f64, Launches, u64);
    let measured = |config: &GenerationConfig| -> Result<Measured, GenerateError> {
        let (read_before, start) = (read_back_bytes(), Instant::now());
        let (run, launches) = count_launches(|| generate(model, device, prompts, config, |_| {}));
        let tokens = run?;
        Ok((tokens, start.elapsed().as_secs_f64(), launches, read_back_bytes() - read_before))
    };
    let first = GenerationConfig { max_new_tokens: 1, ..config.clone() };
    let (_, first_token_s, first_launches, first_read) = measured(&first)?;
    let (tokens, total_s, launches, read) = measured(config)?;
    let n = config.max_new_tokens;
    let steps = (n - 1).max(1) as f64;
    // Two timings of a short request can differ by more than its decode steps took: no step time
    // then, rather than a zero or a negative one.
    let decode_step_s = Some((total_s - first_token_s) / steps).filter(|s| n > 1 && *s > 0.0);
    let mut decode_step_launches = launches.since(&first_launches);
    for count in decode_step_launches.by_kernel.values_mut() {
        *count = (*count as f64 / steps).round() as u64;
    }
    decode_step_launches.by_kernel.retain(|_, &mut n| n > 0);
    let timing = GenerationTiming {
        prompts: prompts.len(),
        batch_size: config.batch_size,
        new_tokens: n,
        warm_up_s,
        first_token_s,
        total_s,
        decode_step_s,
        first_token_launches: first_launches.total(),
        decode_step_launches: (n > 1).then(|| launches.total().saturating_sub(first_launches.total()) as f64 / steps),
        decode_step_kernels: if n > 1 { decode_step_launches } else { Launches::default() },
        decode_step_read_back_bytes: (n > 1).then(|| read.saturating_sub(first_read) as f64 / steps),
    };
    Ok((tokens, timing))
}

/// A device's measured copy bandwidth.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyBandwidth {
    /// Bytes of the copied tensor.
    pub bytes: u64,
    /// Copies per timed repetition.
    pub copies: usize,
    /// Seconds of the fastest repetition.
    pub best_s: f64,
}

impl CopyBandwidth {
    /// Bytes read plus bytes written per second in the fastest repetition.
    pub fn bytes_per_s(&self) -> f64 {
        (2 * self.bytes) as f64 * self.copies as f64 / self.best_s
    }
}

/// Copies per timed repetition: enough kernels that the wait at the end is a small part.
const COPIES_PER_REP: usize = 8;

/// Measures the device's memory bandwidth with a copy kernel: an f32 tensor of `bytes` (rounded
/// down to whole f32s) is read and written by an elementwise kernel (`x · 2` into a new tensor),
/// eight times per repetition, each handed to the device on its own (`flush`: no
/// fusion of the copies into one kernel), then waited for (`sync`). Two untimed warm-up
/// repetitions, then `reps` timed; the fastest counts.
///
/// # Errors
/// [`GenerateError::TooLarge`] when the tensor exceeds the device's largest buffer or is under
/// 1 MiB; [`GenerateError::Unsupported`] for `reps` = 0; [`GenerateError::Readback`] when the
/// device fails.
pub fn copy_bandwidth(device: &ComputeDevice, bytes: u64, reps: usize) -> Result<CopyBandwidth, GenerateError> {
    if reps == 0 {
        return Err(GenerateError::Unsupported("the bandwidth needs at least 1 timed repetition".to_string()));
    }
    if bytes < 1 << 20 {
        return Err(GenerateError::TooLarge(format!(
            "a copy of {bytes} bytes is too small to time; use at least 1 MiB"
        )));
    }
    if let Some(max) = device.max_buffer_bytes.filter(|max| bytes > *max) {
        return Err(GenerateError::TooLarge(format!(
            "a copy of {bytes} bytes exceeds {}'s largest buffer ({max} bytes)",
            device.adapter
        )));
    }
    let len = usize::try_from(bytes / 4)
        .map_err(|_| GenerateError::TooLarge(format!("a copy of {bytes} bytes does not fit this machine's memory")))?;
    let x: Tensor<1> = Tensor::ones([len], &device.device);
    let failed = |e| GenerateError::Readback(format!("{e:?}"));
    let sync = || device.device.sync().map_err(failed);
    sync()?;
    let mut best_s = f64::INFINITY;
    for rep in 0..reps + 2 {
        let start = Instant::now();
        let mut outputs = Vec::with_capacity(COPIES_PER_REP);
        for _ in 0..COPIES_PER_REP {
            outputs.push(x.clone().mul_scalar(2.0));
            device.device.flush().map_err(failed)?;
        }
        sync()?;
        let elapsed = start.elapsed().as_secs_f64();
        drop(outputs);
        if rep >= 2 {
            best_s = best_s.min(elapsed);
        }
    }
    Ok(CopyBandwidth { bytes: len as u64 * 4, copies: COPIES_PER_REP, best_s })
}
