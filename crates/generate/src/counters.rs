//! What a device pays for, counted: kernel launches (through CubeCL's launch observer, which sees
//! every launch the process issues on a CubeCL runtime: wgpu here, fused kernels and autotune
//! candidates included) and bytes read back to the host by generation (the token ids of each
//! step, counted where [`read_back`] reads them).
//!
//! Both counters are process-wide: a count taken around a piece of work includes whatever else
//! the process launched meanwhile. The CPU backend (flex) launches no CubeCL kernel, so its
//! launch count is 0.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use burn::cubecl::config::{TypeNameFormatLevel, type_name_format};
use burn::cubecl::logging::{LaunchObservation, LaunchObserver};
use burn::tensor::kind::Basic;
use burn::tensor::{Tensor, TensorData};

/// Bytes [`read_back`] has read since the process started.
static READ_BACK_BYTES: AtomicU64 = AtomicU64::new(0);

/// Reads a tensor back to the host, counting its bytes (see [`read_back_bytes`]).
///
/// Shapes: any `[d0, …]`; the data keeps the tensor's shape and dtype.
pub(crate) fn read_back<const D: usize, K: Basic>(t: Tensor<D, K>) -> TensorData {
    let data = t.into_data();
    READ_BACK_BYTES.fetch_add(data.as_bytes().len() as u64, Ordering::Relaxed);
    data
}

/// Bytes generation has read back to the host since the process started.
pub fn read_back_bytes() -> u64 {
    READ_BACK_BYTES.load(Ordering::Relaxed)
}

/// Kernel launches, by kernel name (CubeCL's name, shortened as its profiling logger shortens it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Launches {
    /// Launches per kernel name.
    pub by_kernel: BTreeMap<String, u64>,
}

impl Launches {
    /// All launches.
    pub fn total(&self) -> u64 {
        self.by_kernel.values().sum()
    }

    /// The launches of `self` that `earlier` does not have, kernel by kernel (saturating at 0).
    pub fn since(&self, earlier: &Launches) -> Launches {
        let by_kernel = self
            .by_kernel
            .iter()
            .map(|(k, &n)| (k.clone(), n.saturating_sub(earlier.by_kernel.get(k).copied().unwrap_or(0))))
            .filter(|&(_, n)| n > 0)
            .collect();
        Launches { by_kernel }
    }
}

#[derive(Default)]
struct Counter {
    by_kernel: Mutex<BTreeMap<&'static str, u64>>,
    total: AtomicU64,
}

impl LaunchObserver for Counter {
    // Called on the launch path under CubeCL's observer lock: one map update, nothing else.
    fn launched(&self, kernel: &'static str) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let mut map = self.by_kernel.lock().unwrap_or_else(PoisonError::into_inner);
        *map.entry(kernel).or_insert(0) += 1;
    }
}

/// Runs `work` with every CubeCL kernel launch counted. One count at a time: CubeCL has one
/// observer slot, so a nested count replaces the outer one while it runs.
pub fn count_launches<T>(work: impl FnOnce() -> T) -> (T, Launches) {
    let counter = Arc::new(Counter::default());
    let out = {
        let _observing = LaunchObservation::new(counter.clone());
        work()
    };
    let map = counter.by_kernel.lock().unwrap_or_else(PoisonError::into_inner);
    let mut by_kernel = BTreeMap::new();
    for (&name, &n) in map.iter() {
        *by_kernel.entry(type_name_format(name, TypeNameFormatLevel::Short)).or_insert(0) += n;
    }
    (out, Launches { by_kernel })
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    #[test]
    fn read_back_counts_the_bytes_of_the_data() {
        let before = read_back_bytes();
        let t: Tensor<2> = Tensor::ones([3, 5], &Device::flex());
        let data = read_back(t);
        assert_eq!(data.num_elements(), 15);
        // Other tests may read back meanwhile: at least these 60 bytes were added.
        assert!(read_back_bytes() - before >= 60);
    }

    #[test]
    fn launches_since_subtract_kernel_by_kernel() {
        let a = Launches { by_kernel: [("add".to_string(), 5), ("matmul".to_string(), 2)].into() };
        let b = Launches { by_kernel: [("add".to_string(), 9), ("matmul".to_string(), 2), ("exp".into(), 1)].into() };
        let d = b.since(&a);
        assert_eq!(d.by_kernel, [("add".to_string(), 4), ("exp".to_string(), 1)].into());
        assert_eq!(d.total(), 5);
    }

    #[test]
    fn the_cpu_backend_launches_no_cubecl_kernel() {
        let ((), launches) = count_launches(|| {
            let t: Tensor<2> = Tensor::ones([4, 4], &Device::flex());
            let _ = read_back(t.clone().matmul(t));
        });
        assert_eq!(launches.total(), 0);
    }
}
