//! The exit-code rule every command keeps, so that a CI job can branch on it:
//!
//! | code | meaning |
//! |---:|---|
//! | 0 | pass: the command did what was asked (a gate: every check passed) |
//! | 1 | regression: a gate check failed (`gate`, `eval --gate`, `compare --max-worse`) |
//! | 2 | unusable input or usage: a bad flag, a missing or malformed file, a variant that is not a quantization of the reference |
//! | 3 | inconclusive: no check failed, but some could not tell (too few prompts) |
//! | 4 | environment: no device, not enough memory or disk, an I/O error, a file changed while read |
//!
//! A closed standard output (`qdrift eval … | head -1`) ends the process quietly, by SIGPIPE, as
//! `head` expects of a Unix tool ([`quiet_sigpipe`]).

use std::error::Error;
use std::fmt;
use std::io::ErrorKind;

use qdrift_eval::EvalError;

/// Usage or input that cannot be used.
pub(crate) const UNUSABLE: u8 = 2;
/// The machine could not do the work: device, memory, disk, I/O.
pub(crate) const ENVIRONMENT: u8 = 4;

/// The rule in `--help`'s words.
pub(crate) const RULE: &str = "Exit codes, for every command: 0 pass; 1 regression (a gate check failed); 2 unusable \
input or usage (a bad flag, a missing or malformed file, a variant that is not a quantization of the reference); 3 \
inconclusive (no check failed, some could not tell); 4 environment (no device, not enough memory or disk, an I/O \
error, a file changed while it was read).";

/// An error whose message was rewritten (paths as the user gave them), with the exit code of the
/// error it came from.
#[derive(Debug)]
pub(crate) struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    /// `message` for the error `e`, keeping `e`'s exit code.
    pub(crate) fn from_error(e: &(dyn Error + 'static), message: String) -> Failure {
        Failure { code: code_of(e), message }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for Failure {}

/// The exit code for the error `e`: the first error in its chain that decides (an I/O error by its
/// kind, a device or memory error), else [`UNUSABLE`].
pub(crate) fn code_of(e: &(dyn Error + 'static)) -> u8 {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(code) = decides(e) {
            return code;
        }
        next = e.source();
    }
    UNUSABLE
}

/// The exit code `e` alone decides, if any.
fn decides(e: &(dyn Error + 'static)) -> Option<u8> {
    if let Some(f) = e.downcast_ref::<Failure>() {
        return Some(f.code);
    }
    if let Some(e) = e.downcast_ref::<EvalError>() {
        return eval_code(e);
    }
    if let Some(e) = e.downcast_ref::<qdrift_generate::DeviceError>() {
        return Some(device_code(e));
    }
    if let Some(e) = e.downcast_ref::<qdrift_io::IoError>() {
        return file_code(e);
    }
    if let Some(e) = e.downcast_ref::<qdrift_load::LoadError>() {
        return load_code(e);
    }
    e.downcast_ref::<std::io::Error>().map(io_code)
}

fn eval_code(e: &EvalError) -> Option<u8> {
    match e {
        EvalError::Memory(_) | EvalError::DiskSpace(_) | EvalError::NoF16 { .. } | EvalError::Internal(_) => {
            Some(ENVIRONMENT)
        }
        EvalError::Device(e) => Some(device_code(e)),
        EvalError::Generate(qdrift_generate::GenerateError::Readback(_)) => Some(ENVIRONMENT),
        EvalError::Io { source, .. } => Some(io_code(source)),
        EvalError::Load(e) => load_code(e),
        EvalError::File(e) => file_code(e),
        _ => None,
    }
}

/// A device that is missing, fails to start or lacks f16 is the machine's; bf16 on wgpu is a
/// request no wgpu adapter can meet (its shading language has no bf16), so it is the usage's.
fn device_code(e: &qdrift_generate::DeviceError) -> u8 {
    match e {
        qdrift_generate::DeviceError::DType { dtype: "bf16", .. } => UNUSABLE,
        _ => ENVIRONMENT,
    }
}

fn load_code(e: &qdrift_load::LoadError) -> Option<u8> {
    match e {
        qdrift_load::LoadError::Io { source, .. } => Some(io_code(source)),
        qdrift_load::LoadError::File(e) => file_code(e),
        _ => None,
    }
}

/// A file that changed while qdrift read it (a download still running, a copy over a model in
/// use) is the machine's state, not the user's input; other file errors decide by their source.
fn file_code(e: &qdrift_io::IoError) -> Option<u8> {
    match e {
        qdrift_io::IoError::Changed { .. } | qdrift_io::IoError::Rewritten { .. } => Some(ENVIRONMENT),
        _ => None,
    }
}

/// An I/O error is the user's input when it says the path is wrong (a symbolic-link loop
/// included), the machine's otherwise (no space, a failing disk, an interrupted read).
fn io_code(e: &std::io::Error) -> u8 {
    if e.raw_os_error() == Some(libc::ELOOP) {
        return UNUSABLE;
    }
    match e.kind() {
        ErrorKind::NotFound
        | ErrorKind::PermissionDenied
        | ErrorKind::AlreadyExists
        | ErrorKind::InvalidInput
        | ErrorKind::InvalidData
        | ErrorKind::InvalidFilename
        | ErrorKind::IsADirectory
        | ErrorKind::NotADirectory
        | ErrorKind::UnexpectedEof => UNUSABLE,
        _ => ENVIRONMENT,
    }
}

/// Restores the default action of SIGPIPE, which Rust's runtime ignores: a write to a closed pipe
/// then ends the process quietly, as `head` expects, instead of a panic on the failed `print!`.
pub(crate) fn quiet_sigpipe() {
    // SAFETY: called first thing in main, before any thread exists; SIG_DFL is a valid action for
    // SIGPIPE and no handler of ours is replaced.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_split_input_from_environment() {
        assert_eq!(code_of(&std::io::Error::from_raw_os_error(libc::ELOOP)), UNUSABLE);
        let missing = std::io::Error::from(ErrorKind::NotFound);
        assert_eq!(code_of(&missing), UNUSABLE);
        let full = std::io::Error::from(ErrorKind::StorageFull);
        assert_eq!(code_of(&full), ENVIRONMENT);
        let eval = EvalError::Io { path: "x".into(), source: std::io::Error::from(ErrorKind::StorageFull) };
        assert_eq!(code_of(&eval), ENVIRONMENT);
        assert_eq!(code_of(&EvalError::Memory("too big".into())), ENVIRONMENT);
        assert_eq!(code_of(&EvalError::Compare("no".into())), UNUSABLE);
        let kept = Failure::from_error(&EvalError::Memory("m".into()), "rewritten".into());
        assert_eq!(code_of(&kept), ENVIRONMENT);
        // A model rewritten while read, however the error is wrapped, is the environment's.
        let rewritten =
            || qdrift_io::IoError::Rewritten { path: "m.gguf".into(), what: "model", change: "size".into() };
        assert_eq!(code_of(&rewritten()), ENVIRONMENT);
        assert_eq!(code_of(&qdrift_load::LoadError::File(rewritten())), ENVIRONMENT);
        assert_eq!(code_of(&EvalError::Load(qdrift_load::LoadError::File(rewritten()))), ENVIRONMENT);
        // bf16 on wgpu: no adapter can, whatever the machine; f16 on an adapter without it: this one cannot.
        let dtype = |dtype| qdrift_generate::DeviceError::DType { adapter: "a".into(), dtype, why: "w" };
        assert_eq!(code_of(&dtype("bf16")), UNUSABLE);
        assert_eq!(code_of(&EvalError::Device(dtype("bf16"))), UNUSABLE);
        assert_eq!(code_of(&dtype("f16")), ENVIRONMENT);
        assert_eq!(code_of(&qdrift_generate::DeviceError::NoAdapter), ENVIRONMENT);
        let boxed: Box<dyn Error> = "a usage error".into();
        assert_eq!(code_of(&*boxed), UNUSABLE);
    }
}
