//! `--backend`: the CPU backend (default), the simulated NPU, or the NPU through
//! XRT (the engine's `Target` runs them).

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
