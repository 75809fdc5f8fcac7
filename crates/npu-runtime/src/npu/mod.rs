//! The NPU backend: a [`DispatchPlan`] (every kernel invocation of a forward pass,
//! its buffer bindings and packed weights) run by a [`Device`].
//!
//! Two devices run plans: [`SimDevice`], a simulated NPU that executes each op with
//! the CPU kernels over its own host buffers (CI runs the backend test-suite on it,
//! bit-identical to [`crate::CpuTarget`]), and, with the cargo feature `xrt`,
//! `XrtDevice`, which dispatches each op to the kernel a [`KernelManifest`] names on a
//! Ryzen AI NPU through `xrt-sys`. [`compare::compare_ops`] is the op-by-op
//! comparison against the CPU reference; [`presence`] says whether an NPU is usable
//! here and why not.

pub mod compare;
mod device;
pub mod manifest;
pub mod pack;
pub mod plan;
pub mod presence;
mod target;
#[cfg(feature = "xrt")]
mod xrt;

pub use device::{Device, SimDevice};
pub use manifest::KernelManifest;
pub use plan::{DispatchPlan, PlanOptions};
pub use presence::BUILT_WITHOUT_XRT;
pub use target::NpuTarget;
#[cfg(feature = "xrt")]
pub use xrt::XrtDevice;

/// Opens XRT device `index` with the kernels of `manifest`, or says why it cannot.
#[cfg(feature = "xrt")]
pub fn open_npu(manifest: &std::path::Path, index: u32) -> crate::Result<XrtDevice> {
    XrtDevice::open(KernelManifest::open(manifest)?, index)
}

/// Without the `xrt` feature there is no NPU device to open.
#[cfg(not(feature = "xrt"))]
pub fn open_npu(manifest: &std::path::Path, index: u32) -> crate::Result<SimDevice> {
    let _ = (manifest, index);
    Err(crate::TargetError::Unsupported(BUILT_WITHOUT_XRT.into()))
}
