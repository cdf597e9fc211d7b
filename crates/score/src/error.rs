use thiserror::Error;

/// Everything that can be wrong with the input of a score function.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ScoreError {
    /// A slice that must hold at least one element is empty.
    #[error("{what}: empty input, need at least one value")]
    Empty { what: &'static str },
    /// Two slices that must be paired element by element have different lengths.
    #[error("{what}: lengths differ ({left} vs {right}); the inputs must be paired one to one")]
    LengthMismatch { what: &'static str, left: usize, right: usize },
    /// A confidence level is not strictly between 0 and 1 (e.g. 95 instead of 0.95).
    #[error("confidence level {level} is outside (0, 1); write 95% as 0.95")]
    Level { level: f64 },
    /// A quantile's probability is outside [0, 1].
    #[error("quantile probability {p} is outside [0, 1]")]
    Probability { p: f64 },
    /// A value is NaN or infinite.
    #[error("{what}: non-finite value {value} at index {index}")]
    NonFinite { what: &'static str, index: usize, value: f64 },
    /// An index (a token id, a success count) is not below its limit.
    #[error("{what}: {index} is out of range, must be below {limit}")]
    OutOfRange { what: &'static str, index: usize, limit: usize },
    /// A sequence is shorter than the horizon it is scored at.
    #[error("{what} holds {len} tokens, fewer than the horizon of {horizon}")]
    TooShort { what: &'static str, len: usize, horizon: usize },
    /// A count that must be positive (resamples, horizon) is zero.
    #[error("{what} must be at least 1")]
    Zero { what: &'static str },

    /// Reading device results back to the host failed.
    #[error("reading {what} from the device failed: {message}")]
    Device { what: &'static str, message: String },
}

pub(crate) type Result<T> = std::result::Result<T, ScoreError>;

/// Refuses an empty slice.
pub(crate) fn check_nonempty<T>(what: &'static str, values: &[T]) -> Result<()> {
    if values.is_empty() { Err(ScoreError::Empty { what }) } else { Ok(()) }
}

/// Refuses a NaN or infinity, naming the first one.
pub(crate) fn check_finite<T: Copy + Into<f64>>(what: &'static str, values: &[T]) -> Result<()> {
    match values.iter().map(|&v| v.into()).enumerate().find(|(_, v)| !v.is_finite()) {
        Some((index, value)) => Err(ScoreError::NonFinite { what, index, value }),
        None => Ok(()),
    }
}

/// Refuses a confidence level outside the open interval (0, 1).
pub(crate) fn check_level(level: f64) -> Result<()> {
    if level > 0.0 && level < 1.0 { Ok(()) } else { Err(ScoreError::Level { level }) }
}

/// Refuses two slices of different lengths.
pub(crate) fn check_paired(what: &'static str, left: usize, right: usize) -> Result<()> {
    if left == right { Ok(()) } else { Err(ScoreError::LengthMismatch { what, left, right }) }
}
