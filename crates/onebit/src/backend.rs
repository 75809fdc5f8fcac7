//! `--backend`: the CPU backend (default), the simulated NPU, or the NPU through
//! XRT, behind one [`Target`] that the run and bench commands drive.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use npu_runtime::kernels::Isa;
use npu_runtime::npu::{NpuTarget, PlanOptions, SimDevice};
use npu_runtime::{
    CpuModel, CpuOptions, CpuTarget, Forward, HeadKind, KvType, Precision, TapSink, TargetConfig,
    TargetPackage,
};
use std::sync::Arc;

/// `--backend` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// The CPU backend: the reference and the fast default.
    Cpu,
    /// The NPU dispatch plan run by the simulated device (CPU kernels, device buffers).
    Sim,
    /// The NPU through XRT, with the kernels of --kernels (needs the `xrt` build).
    Npu,
}

impl BackendArg {
    /// The name `--backend` takes.
    pub fn name(self) -> &'static str {
        match self {
            BackendArg::Cpu => "cpu",
            BackendArg::Sim => "sim",
            BackendArg::Npu => "npu",
        }
    }
}

/// A target on some backend.
pub enum Target<'a> {
    Cpu(CpuTarget),
    Sim(Box<NpuTarget<'a, SimDevice>>, Isa),
    #[cfg(feature = "xrt")]
    Npu(NpuTarget<'a, npu_runtime::npu::XrtDevice>),
}

/// What the NPU backends need beyond the CPU's options.
pub struct NpuOptions {
    pub kernels: Option<PathBuf>,
    pub device: u32,
}

impl<'a> Target<'a> {
    /// Opens `package` on `backend` with the CPU's options (the sim uses their kernel and
    /// head; the NPU backends refuse other precisions and KV types than f32 by name).
    pub fn open(
        package: &'a Arc<TargetPackage>,
        backend: BackendArg,
        cpu: CpuOptions,
        npu: &NpuOptions,
    ) -> Result<Target<'a>> {
        let CpuOptions {
            kernel,
            precision,
            kv_type,
            head,
            ..
        } = cpu;
        if backend != BackendArg::Cpu && precision != Precision::F32 {
            bail!(
                "--precision {}: the {} backend runs the f32 family only (the q8 kernels are CPU kernels); use --precision f32 or auto",
                precision.name(),
                backend.name()
            );
        }
        if backend != BackendArg::Cpu && kv_type != KvType::F32 {
            bail!(
                "--kv-type {}: the {} backend keeps an f32 KV cache (the NPU plan's buffers); use --kv-type f32 or auto",
                kv_type.name(),
                backend.name()
            );
        }
        let mut options = PlanOptions::for_model(&package.config);
        if let Some(h) = head {
            options.head = h;
        }
        match backend {
            BackendArg::Cpu => Ok(Target::Cpu(CpuModel::load(package.clone(), cpu)?.session())),
            BackendArg::Sim => Ok(Target::Sim(
                Box::new(NpuTarget::new(package, SimDevice::new(kernel), options)?),
                kernel,
            )),
            BackendArg::Npu => {
                let manifest = npu
                    .kernels
                    .as_ref()
                    .context("--backend npu needs --kernels MANIFEST (see docs/npu.md)")?;
                #[cfg(feature = "xrt")]
                {
                    let device = npu_runtime::npu::open_npu(manifest, npu.device)?;
                    Ok(Target::Npu(NpuTarget::new(package, device, options)?))
                }
                #[cfg(not(feature = "xrt"))]
                {
                    let _ = (manifest, options, npu.device);
                    bail!("--backend npu: {}", npu_runtime::npu::BUILT_WITHOUT_XRT)
                }
            }
        }
    }

    fn forward_target(&self) -> &dyn Forward {
        match self {
            Target::Cpu(t) => t,
            Target::Sim(t, _) => t.as_ref(),
            #[cfg(feature = "xrt")]
            Target::Npu(t) => t,
        }
    }

    fn forward_target_mut(&mut self) -> &mut dyn Forward {
        match self {
            Target::Cpu(t) => t,
            Target::Sim(t, _) => t.as_mut(),
            #[cfg(feature = "xrt")]
            Target::Npu(t) => t,
        }
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

    /// Draft hooks with this target's embedding and head: the CPU target's own shared
    /// model, or for the NPU backends a CPU model of the package with the same head.
    pub fn draft_hooks(&self, package: &Arc<TargetPackage>) -> Result<mtp::PackageHooks> {
        Ok(match self {
            Target::Cpu(t) => mtp::PackageHooks::for_model(t.model().clone()),
            _ => mtp::PackageHooks::new(package, self.head())?,
        })
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

/// Refuses NPU-only options on other backends.
pub fn check_npu_options(backend: BackendArg, npu: &NpuOptions) -> Result<()> {
    if backend != BackendArg::Npu && npu.kernels.is_some() {
        bail!("--kernels only applies to --backend npu");
    }
    Ok(())
}
