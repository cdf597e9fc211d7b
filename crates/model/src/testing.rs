//! What the unit tests share: the wgpu device they run on.

use burn::tensor::Device;

/// The wgpu device the unit tests share, started once per test process on Vulkan's CPU adapter
/// (Mesa's lavapipe; CI installs it): CubeCL registers a device's runtime once per process, so a
/// second `init` of the same device fails.
pub(crate) fn test_wgpu() -> Device {
    use burn::tensor::DeviceKind;
    use burn::tensor::wgpu::WgpuBackend;
    static DEVICE: std::sync::OnceLock<Result<Device, String>> = std::sync::OnceLock::new();
    let started = DEVICE.get_or_init(|| {
        Device::wgpu_options()
            .device_kind(DeviceKind::Cpu)
            .graphics_api(WgpuBackend::Vulkan)
            .init()
            .map_err(|e| e.to_string())
    });
    match started {
        Ok(device) => device.clone(),
        Err(e) => panic!("this test needs a Vulkan adapter (CI installs Mesa's lavapipe): {e}"),
    }
}
