//! Generation: picking a compute device, and batched greedy decoding with a preallocated
//! key-value cache.
//!
//! Input is token ids (tokenizing is the load stage's job) and a [`qdrift_model::Llama`] already
//! on a device; output is token ids, plus the logits of every step handed to a caller-supplied
//! observer so that the scoring stage can reduce them where they are computed.

mod device;
mod forced;
mod greedy;
mod parallel;

pub use device::{BackendChoice, ComputeDevice, DeviceError, select_device};
pub use forced::{ForcedLogits, PairedLogits, teacher_forced, teacher_forced_pair};
pub use greedy::{GenerateError, GenerationConfig, StepLogits, check_request, generate};
