//! The backends behind one [`Target`]: the CPU backend (default), the simulated NPU,
//! or the NPU through XRT.

use std::path::PathBuf;
use std::sync::Arc;

use npu_runtime::kernels::Isa;
use npu_runtime::npu::{NpuTarget, PlanOptions, SimDevice};
use npu_runtime::{
    CpuModel, CpuOptions, CpuTarget, Forward, HeadKind, KvType, Precision, TapSink, TargetConfig,
    TargetPackage,
};

use crate::error::{EngineError, Result};
use crate::hooks::PackageHooks;
pub use npu_runtime::profile::{PassProfile, Stage};

/// Where the target runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// The CPU backend: the reference and the fast default.
    #[default]
    Cpu,
    /// The NPU dispatch plan run by the simulated device (CPU kernels, device buffers).
    Sim,
    /// The NPU through XRT (needs the `xrt` feature).
    Npu {
        /// The kernel manifest (JSON; docs/npu.md).
        kernels: Option<PathBuf>,
        /// The XRT device index.
        device: u32,
    },
}

impl Backend {
    /// The name `--backend` takes.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Sim => "sim",
            Backend::Npu { .. } => "npu",
        }
    }
}

/// A target on some backend.
#[allow(missing_docs)] // the variants are the backends
pub enum Target<'a> {
    Cpu(CpuTarget),
    Sim(Box<NpuTarget<'a, SimDevice>>, Isa),
    #[cfg(feature = "xrt")]
    Npu(Box<NpuTarget<'a, npu_runtime::npu::XrtDevice>>),
}

impl<'a> Target<'a> {
    /// Opens `package` on `backend` with the CPU's options (on the CPU, over a model of
    /// its own: sessions sharing one model come from [`CpuModel::session`]; the sim uses
    /// their kernel and head; the NPU backends refuse other precisions and KV types than
    /// f32 by name).
    pub fn open(
        package: &'a Arc<TargetPackage>,
        backend: &Backend,
        cpu: CpuOptions,
    ) -> Result<Target<'a>> {
        let CpuOptions {
            kernel,
            threads,
            precision,
            head,
            kv_type,
        } = cpu;
        if threads == Some(0) {
            return Err(EngineError::Invalid("--threads must be at least 1".into()));
        }
        if !matches!(backend, Backend::Cpu) && precision != Precision::F32 {
            return Err(EngineError::Invalid(format!(
                "--precision {}: the {} backend runs the f32 family only (the q8 kernels are CPU kernels); use --precision f32 or auto",
                precision.name(),
                backend.name()
            )));
        }
        if !matches!(backend, Backend::Cpu) && kv_type != KvType::F32 {
            return Err(EngineError::Invalid(format!(
                "--kv-type {}: the {} backend keeps an f32 KV cache (the NPU plan's buffers); use --kv-type f32 or auto",
                kv_type.name(),
                backend.name()
            )));
        }
        let mut options = PlanOptions::for_model(&package.config);
        if let Some(h) = head {
            options.head = h;
        }
        match backend {
            Backend::Cpu => Ok(Target::Cpu(CpuModel::load(package.clone(), cpu)?.session())),
            Backend::Sim => Ok(Target::Sim(
                Box::new(NpuTarget::new(package, SimDevice::new(kernel), options)?),
                kernel,
            )),
            Backend::Npu { kernels, device } => {
                let manifest = kernels.as_ref().ok_or_else(|| {
                    EngineError::Invalid(
                        "--backend npu needs --kernels MANIFEST (see docs/npu.md)".into(),
                    )
                })?;
                #[cfg(feature = "xrt")]
                {
                    let device = npu_runtime::npu::open_npu(manifest, *device)?;
                    Ok(Target::Npu(Box::new(NpuTarget::new(
                        package, device, options,
                    )?)))
                }
                #[cfg(not(feature = "xrt"))]
                {
                    let _ = (manifest, options, device);
                    Err(EngineError::Invalid(format!(
                        "--backend npu: {}",
                        npu_runtime::npu::BUILT_WITHOUT_XRT
                    )))
                }
            }
        }
    }

    fn forward_target(&self) -> &dyn Forward {
        match self {
            Target::Cpu(t) => t,
            Target::Sim(t, _) => t.as_ref(),
            #[cfg(feature = "xrt")]
            Target::Npu(t) => t.as_ref(),
        }
    }

    fn forward_target_mut(&mut self) -> &mut dyn Forward {
        match self {
            Target::Cpu(t) => t,
            Target::Sim(t, _) => t.as_mut(),
            #[cfg(feature = "xrt")]
            Target::Npu(t) => t.as_mut(),
        }
    }

    /// Draft hooks with this target's embedding and head: the CPU target's own shared
    /// model, or for the NPU backends a CPU model of the package with the same head.
    pub fn draft_hooks(&self, package: &Arc<TargetPackage>) -> Result<PackageHooks> {
        Ok(match self {
            Target::Cpu(t) => PackageHooks::for_model(t.model().clone()),
            _ => PackageHooks::new(package, self.head())?,
        })
    }

    /// The backend's name for reports.
    pub fn backend(&self) -> String {
        match self {
            Target::Cpu(_) => "cpu".into(),
            Target::Sim(t, _) => format!("sim: {}", npu_runtime::npu::Device::describe(t.device())),
            #[cfg(feature = "xrt")]
            Target::Npu(t) => format!("npu: {}", npu_runtime::npu::Device::describe(t.device())),
        }
    }

    /// Worker threads doing the host-side work.
    pub fn threads(&self) -> usize {
        match self {
            Target::Cpu(t) => t.threads(),
            _ => rayon::current_num_threads(),
        }
    }

    /// The activation precision of the projections.
    pub fn precision(&self) -> Precision {
        match self {
            Target::Cpu(t) => t.precision(),
            _ => Precision::F32,
        }
    }

    /// The KV cache's storage type.
    pub fn kv_type(&self) -> KvType {
        match self {
            Target::Cpu(t) => t.kv_type(),
            _ => KvType::F32,
        }
    }

    /// The CPU matmul kernel in use (the sim's too).
    pub fn kernel(&self) -> Isa {
        match self {
            Target::Cpu(t) => t.kernel(),
            Target::Sim(_, k) => *k,
            #[cfg(feature = "xrt")]
            Target::Npu(_) => Isa::detect(),
        }
    }

    /// The head in use.
    pub fn head(&self) -> HeadKind {
        match self {
            Target::Cpu(t) => t.head(),
            Target::Sim(t, _) => t.head(),
            #[cfg(feature = "xrt")]
            Target::Npu(t) => t.head(),
        }
    }

    /// Profiles this session's passes from now on (`true`) or stops; only the CPU
    /// backend times its stages: returns whether this one does.
    pub fn set_profiling(&mut self, on: bool) -> bool {
        match self {
            Target::Cpu(t) => {
                t.set_profiling(on);
                true
            }
            _ => false,
        }
    }

    /// Bytes the KV cache has allocated, where it grows with the positions (the CPU
    /// backend); `None` where its buffers are fixed by a plan (the sim, the NPU).
    pub fn kv_capacity_bytes(&self) -> Option<usize> {
        match self {
            Target::Cpu(t) => Some(t.kv_capacity_bytes()),
            _ => None,
        }
    }

    /// Empties the KV cache (position 0) and, on the CPU backend, gives its memory back
    /// (a plan's fixed buffers stay).
    pub fn release_kv(&mut self) {
        match self {
            Target::Cpu(t) => t.release_kv(),
            // Truncating to 0 cannot fail on any backend.
            _ => {
                let _ = self.truncate(0);
            }
        }
    }

    /// The stages' times of the passes since profiling began or since the last call
    /// (`None` when not profiling).
    pub fn take_profile(&mut self) -> Option<PassProfile> {
        match self {
            Target::Cpu(t) => t.take_profile(),
            _ => None,
        }
    }

    /// Weight bytes one pass streams.
    pub fn weight_bytes_per_pass(&self) -> usize {
        match self {
            Target::Cpu(t) => t.weight_bytes_per_pass(),
            Target::Sim(t, _) => weights_in_plan(t.plan()),
            #[cfg(feature = "xrt")]
            Target::Npu(t) => weights_in_plan(t.plan()),
        }
    }
}

fn weights_in_plan(plan: &npu_runtime::npu::DispatchPlan) -> usize {
    plan.bytes_of(npu_runtime::npu::plan::BufferRole::Weights)
}

impl Forward for Target<'_> {
    fn config(&self) -> &TargetConfig {
        self.forward_target().config()
    }
    fn position(&self) -> usize {
        self.forward_target().position()
    }
    fn forward(&mut self, tokens: &[u32]) -> npu_runtime::Result<Vec<f32>> {
        self.forward_target_mut().forward(tokens)
    }
    fn forward_last(&mut self, tokens: &[u32]) -> npu_runtime::Result<Vec<f32>> {
        self.forward_target_mut().forward_last(tokens)
    }
    fn last_hidden(&self) -> &[f32] {
        self.forward_target().last_hidden()
    }
    fn truncate(&mut self, len: usize) -> npu_runtime::Result<()> {
        self.forward_target_mut().truncate(len)
    }
    fn set_layer_taps(&mut self, layers: &[usize], sink: TapSink) -> npu_runtime::Result<()> {
        self.forward_target_mut().set_layer_taps(layers, sink)
    }
    fn clear_layer_taps(&mut self) {
        self.forward_target_mut().clear_layer_taps()
    }
    fn embed(&self, tokens: &[u32]) -> npu_runtime::Result<Vec<f32>> {
        self.forward_target().embed(tokens)
    }
    fn lm_head(&self, hidden: &[f32], n: usize) -> Vec<f32> {
        self.forward_target().lm_head(hidden, n)
    }
}
