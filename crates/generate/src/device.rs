//! Choosing where the model runs: wgpu on a GPU adapter, or Burn's pure-Rust CPU backend (flex).
//!
//! [`ComputeDevice`] also carries what a report says about the device (backend, adapter, why it
//! was chosen) and what sizing needs (largest buffer, f16 support, host memory, batches at once).
//! **Invariant: a process starts each device once; asking again returns the same device.**

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use burn::tensor::wgpu::{WgpuBackend, wgpu};
use burn::tensor::{DType, Device, DeviceKind};
use qdrift_model::{AttentionKernel, Llama, ModelError};
use qdrift_weights::WeightSource;

/// What the user asked for with `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// wgpu on a hardware GPU adapter (discrete or integrated) if there is one, else the CPU.
    Auto,
    /// wgpu on the best adapter there is, even a software one (Mesa's lavapipe).
    Wgpu,
    /// Burn's flex CPU backend.
    Cpu,
}

impl std::str::FromStr for BackendChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "wgpu" => Ok(Self::Wgpu),
            "cpu" => Ok(Self::Cpu),
            other => Err(format!("unknown backend \"{other}\"; known: auto, wgpu, cpu")),
        }
    }
}

/// A device ready for tensors, and what a report needs to say about it.
#[derive(Debug, Clone)]
pub struct ComputeDevice {
    /// The Burn device.
    pub device: Device,
    /// `"wgpu"` or `"cpu"`.
    pub backend: &'static str,
    /// Adapter name (`"llvmpipe (LLVM 15.0.6, 256 bits)"`, `"NVIDIA H200"`, `"CPU (2 threads,
    /// AVX-512)"`: the CPU backend's threads and the instruction set its kernels use).
    pub adapter: String,
    /// Graphics API and adapter type for wgpu (`"Vulkan, Cpu"`), empty for the CPU backend.
    pub adapter_detail: String,
    /// Why this device was chosen, for stderr.
    pub reason: String,
    /// Largest single buffer the device accepts, in bytes (`None`: no limit of its own).
    pub max_buffer_bytes: Option<u64>,
    /// Whether the device computes in f16.
    pub supports_f16: bool,
    /// Whether the device's memory is the host's (CPU backend, software adapters), so that host
    /// memory bounds what it can allocate.
    pub uses_host_memory: bool,
    /// Batches of prompts run at once, one per thread: the CPU's cores for the CPU backend, 1 for
    /// wgpu (one queue). Results do not depend on it; set it to 1 for callbacks in batch order.
    pub parallel_batches: usize,
}

/// Errors choosing or starting a device.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// wgpu found no adapter on an API with compute shaders and f16 (Vulkan, Metal, DX12).
    #[error(
        "no wgpu adapter found on Vulkan, Metal or DX12; on Debian, `apt-get install mesa-vulkan-drivers libvulkan1` provides a software Vulkan driver (lavapipe), or use --backend cpu"
    )]
    NoAdapter,
    /// The device cannot compute in the requested dtype.
    #[error("{adapter} cannot compute in {dtype}: {why}")]
    DType {
        /// The adapter.
        adapter: String,
        /// The dtype, as `--dtype` names it.
        dtype: &'static str,
        /// Why, and what would run.
        why: &'static str,
    },
    /// wgpu failed to start on the chosen adapter.
    #[error("cannot start wgpu on {adapter}: {message}")]
    Init {
        /// The adapter.
        adapter: String,
        /// wgpu's or Burn's error.
        message: String,
    },
}

impl ComputeDevice {
    /// What runs, in one line for the start of a run's stderr: the backend, the adapter and its
    /// kind (`wgpu: llvmpipe (LLVM 15.0.6, 256 bits) (software rasterizer, CPU)`), and why it was
    /// chosen.
    pub fn announce(&self) -> String {
        let kind = match (self.backend, self.uses_host_memory) {
            ("cpu", _) => String::new(),
            (_, true) => " (software rasterizer, CPU)".to_string(),
            (_, false) => format!(" (GPU: {})", self.adapter_detail),
        };
        format!("{}: {}{kind}; {}", self.backend, self.adapter, self.reason)
    }

    /// A warning for wgpu on a software adapter (Mesa's lavapipe): the GPU path computed on the
    /// CPU, far slower than the CPU backend; `None` elsewhere.
    pub fn software_warning(&self) -> Option<String> {
        (self.backend == "wgpu" && self.uses_host_memory).then(|| {
            format!(
                "{} is a software rasterizer: the GPU path runs on the CPU, and compiling its kernels dominates a \
                 short run (2 prompts × 10 tokens took 6 min 0 s on it, 2 s with --backend cpu; docs/BENCHMARKS.md). \
                 Use --backend cpu unless you are testing the GPU path",
                self.adapter
            )
        })
    }

    /// Refuses a compute dtype the device cannot run: f32 runs everywhere; f16 where the device
    /// computes in f16 ([`ComputeDevice::supports_f16`]); bf16 on the CPU backend only, since
    /// WGSL, the shading language Burn's wgpu backend compiles to, has no bf16 type.
    ///
    /// # Errors
    /// [`DeviceError::DType`], naming the adapter.
    pub fn check_dtype(&self, dtype: DType) -> Result<(), DeviceError> {
        let refuse = |dtype, why| Err(DeviceError::DType { adapter: self.adapter.clone(), dtype, why });
        match dtype {
            DType::F16 if !self.supports_f16 => refuse("f16", "the adapter has no f16 shaders; use --dtype f32"),
            DType::BF16 if self.backend != "cpu" => refuse(
                "bf16",
                "wgpu's shading language (WGSL) has no bf16 type; use --backend cpu for a bf16 reference, or --dtype f16 or f32",
            ),
            DType::F16 | DType::BF16 | DType::F32 => Ok(()),
            _ => refuse("that dtype", "use --dtype f16, bf16 or f32"),
        }
    }

    /// Builds a model on this device from `source` in `dtype` (`Llama::from_source_within`):
    /// a tensor larger than the device's largest buffer ([`ComputeDevice::max_buffer_bytes`]) is
    /// held in ranges that fit it.
    ///
    /// # Errors
    /// As `Llama::from_source`.
    pub fn build_model(&self, source: &dyn WeightSource, dtype: DType) -> Result<Llama, ModelError> {
        let mut model = Llama::from_source_within(source, dtype, &self.device, self.max_buffer_bytes)?;
        model.set_attention_kernel(self.attention_kernel(dtype));
        Ok(model)
    }

    /// The attention kernel models built here use in `dtype`: `$QDRIFT_ATTENTION` (`fused` or
    /// `composed`) where it names one the device runs, else Burn's fused attention op on a
    /// hardware GPU in f16 and [`AttentionKernel::for_device`] elsewhere. On lavapipe the op's
    /// autotune picks Burn's unfused fallback, which launches more kernels than the composed path
    /// under fusion (measured in docs/BENCHMARKS.md), so the composed path stays its default.
    pub fn attention_kernel(&self, dtype: DType) -> AttentionKernel {
        let default = AttentionKernel::for_device(&self.device, dtype);
        if self.backend != "wgpu" || dtype != DType::F16 {
            return default;
        }
        match std::env::var(ATTENTION_VAR).ok().as_deref() {
            Some("fused") => AttentionKernel::Fused,
            Some("composed") => AttentionKernel::Composed,
            _ if !self.uses_host_memory => AttentionKernel::Fused,
            _ => default,
        }
    }
}

/// The environment variable that picks the attention kernel on wgpu in f16
/// ([`ComputeDevice::attention_kernel`]): `fused` or `composed`.
pub const ATTENTION_VAR: &str = "QDRIFT_ATTENTION";

/// Picks and starts the device for `choice`.
///
/// A process starts each device once; later calls with the same choice return the same device.
pub fn select_device(choice: BackendChoice) -> Result<ComputeDevice, DeviceError> {
    static CHOSEN: OnceLock<Mutex<Vec<(BackendChoice, ComputeDevice)>>> = OnceLock::new();
    let chosen = CHOSEN.get_or_init(|| Mutex::new(Vec::new()));
    let mut chosen = chosen.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, d)) = chosen.iter().find(|(c, _)| *c == choice) {
        return Ok(d.clone());
    }
    let device = match choice {
        BackendChoice::Cpu => cpu("--backend cpu".to_string()),
        BackendChoice::Wgpu => {
            let adapters = adapters();
            let best = best_adapter(&adapters, true).ok_or(DeviceError::NoAdapter)?;
            // A device already started for `auto` on the same adapter is reused.
            if let Some((_, d)) = chosen.iter().find(|(_, d)| d.backend == "wgpu" && d.adapter == best.name) {
                d.clone()
            } else {
                start_wgpu(best, "--backend wgpu".to_string())?
            }
        }
        BackendChoice::Auto => {
            let adapters = adapters();
            match best_adapter(&adapters, false) {
                Some(a) => start_wgpu(a, format!("--backend auto: hardware GPU adapter {}", a.name))?,
                None => {
                    let seen = if adapters.is_empty() {
                        "no wgpu adapter".to_string()
                    } else {
                        adapters.iter().map(describe).collect::<Vec<_>>().join("; ")
                    };
                    cpu(format!("--backend auto: no hardware GPU adapter ({seen}); using the CPU backend"))
                }
            }
        }
    };
    chosen.push((choice, device.clone()));
    Ok(device)
}

fn cpu(reason: String) -> ComputeDevice {
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    ComputeDevice {
        device: Device::flex(),
        backend: "cpu",
        adapter: cpu_name(threads),
        adapter_detail: String::new(),
        reason,
        max_buffer_bytes: None,
        supports_f16: true,
        uses_host_memory: true,
        parallel_batches: threads,
    }
}

/// The CPU backend as reports and stderr name it: `CPU (2 threads, AVX-512)`, the threads its
/// kernels spread over and the instruction set they run with (`QDRIFT_ISA` may narrow it).
fn cpu_name(threads: usize) -> String {
    let isa = match qdrift_model::Isa::current() {
        qdrift_model::Isa::Portable => "portable kernels",
        qdrift_model::Isa::Avx2 => "AVX2",
        qdrift_model::Isa::Avx512 => "AVX-512",
    };
    format!("CPU ({threads} thread{}, {isa})", if threads == 1 { "" } else { "s" })
}

fn adapters() -> Vec<wgpu::AdapterInfo> {
    // Only APIs that Burn's wgpu runtime computes on with f16: OpenGL (wgpu's fallback when no
    // Vulkan driver is installed) has no f16 and is not offered.
    let backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    futures_lite::future::block_on(instance.enumerate_adapters(backends)).iter().map(wgpu::Adapter::get_info).collect()
}

fn describe(a: &wgpu::AdapterInfo) -> String {
    format!("{} ({:?}, {:?})", a.name, a.backend, a.device_type)
}

/// Discrete before integrated before (when allowed) virtual and CPU adapters.
fn best_adapter(adapters: &[wgpu::AdapterInfo], allow_software: bool) -> Option<&wgpu::AdapterInfo> {
    use wgpu::DeviceType as T;
    let rank = |t: T| match t {
        T::DiscreteGpu => Some(0),
        T::IntegratedGpu => Some(1),
        T::VirtualGpu if allow_software => Some(2),
        T::Cpu if allow_software => Some(3),
        T::Other if allow_software => Some(4),
        _ => None,
    };
    adapters.iter().filter_map(|a| rank(a.device_type).map(|r| (r, a))).min_by_key(|(r, _)| *r).map(|(_, a)| a)
}

/// The environment variable that names qdrift's GPU cache folder ([`gpu_cache_dir`]).
pub const CACHE_DIR_VAR: &str = "QDRIFT_CACHE_DIR";

/// The folder qdrift gives CubeCL as its environment root, where CubeCL keeps autotune results
/// when built with its `persistence` feature (qdrift-cli's feature `autotune-cache`):
/// `$QDRIFT_CACHE_DIR` if set, else `$XDG_CACHE_HOME/qdrift/cubecl`, else
/// `$HOME/.cache/qdrift/cubecl`; `None` when none of them is set. The workspace build leaves that
/// feature off (its store, turso, lengthens a cold build, and an empty cache slows the wgpu
/// tests; docs/BENCHMARKS.md): CubeCL then writes nothing there, and every process compiles and
/// autotunes its kernels again (within a process, each shape is tuned once).
pub fn gpu_cache_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var(CACHE_DIR_VAR)
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("qdrift/cubecl")))
        .or_else(|| var("HOME").map(|d| d.join(".cache/qdrift/cubecl")))
}

/// Points CubeCL's environment root (its persistent caches, in a build that has them) at
/// [`gpu_cache_dir`], once per process, before the first wgpu device starts. A user's
/// `cubecl.toml` keeps every other setting; its `environment.path` gives way to qdrift's folder.
fn configure_gpu_cache() {
    use burn::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig, cache::CacheConfig};
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let Some(dir) = gpu_cache_dir() else { return };
        if let Err(e) = std::fs::create_dir_all(&dir) {
            eprintln!("qdrift: warning: cannot create the GPU cache folder {}: {e}", dir.display());
        }
        let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
        config.environment.path = CacheConfig::Directory(dir.clone());
        if !CubeClRuntimeConfig::try_set(config) {
            // CubeCL read its configuration already (a device started first): move the root.
            burn::cubecl::environment::set_root(dir);
        }
    });
}

fn start_wgpu(info: &wgpu::AdapterInfo, reason: String) -> Result<ComputeDevice, DeviceError> {
    use wgpu::DeviceType as T;
    configure_gpu_cache();
    let api = match info.backend {
        wgpu::Backend::Metal => WgpuBackend::Metal,
        wgpu::Backend::Dx12 => WgpuBackend::Dx12,
        _ => WgpuBackend::Vulkan,
    };
    // DeviceKind indices count adapters of one type on the chosen API, in enumeration order.
    let kind = match info.device_type {
        T::DiscreteGpu => DeviceKind::DiscreteGpu(0),
        T::IntegratedGpu => DeviceKind::IntegratedGpu(0),
        T::VirtualGpu => DeviceKind::VirtualGpu(0),
        T::Cpu | T::Other => DeviceKind::Cpu,
    };
    let (device, setup) = Device::wgpu_options()
        .device_kind(kind)
        .graphics_api(api)
        .init_with_setup()
        .map_err(|e| DeviceError::Init { adapter: describe(info), message: e.to_string() })?;
    let actual = setup.adapter.get_info();
    let limits = setup.adapter.limits();
    Ok(ComputeDevice {
        device,
        backend: "wgpu",
        adapter: actual.name.clone(),
        adapter_detail: format!(
            "{:?}, {:?}, driver {} {}",
            actual.backend, actual.device_type, actual.driver, actual.driver_info
        ),
        reason,
        max_buffer_bytes: Some(limits.max_storage_buffer_binding_size.min(limits.max_buffer_size)),
        supports_f16: setup.adapter.features().contains(wgpu::Features::SHADER_F16),
        uses_host_memory: matches!(actual.device_type, T::Cpu),
        parallel_batches: 1,
    })
}
