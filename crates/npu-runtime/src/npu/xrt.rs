//! The XRT device: each op of the plan runs the kernel the manifest names for its
//! kind, with the manifest's argument layout, on a Ryzen AI NPU. Buffers are
//! host-only buffer objects in the memory group of their first binding; a pass is
//! submitted as one runlist.

use std::collections::HashMap;
use std::path::PathBuf;

use xrt_sys::{Buffer, BufferKind, Context, Kernel};

use super::device::Device;
use super::manifest::{load_instructions, KernelArg, KernelCode, KernelEntry, KernelManifest};
use super::plan::{BufferId, BufferSpec, Geometry, Op, PassArgs};
use crate::error::{Result, TargetError};

fn xrt_error(e: xrt_sys::XrtError) -> TargetError {
    TargetError::Unsupported(format!("npu: {e}"))
}

struct LoadedKernel {
    entry: KernelEntry,
    kernel: Kernel,
    instructions: Option<(Buffer, u32)>,
}

/// A Ryzen AI NPU driven through XRT.
pub struct XrtDevice {
    index: u32,
    name: String,
    /// One context per xclbin the manifest names.
    contexts: HashMap<PathBuf, Context>,
    kernels: HashMap<String, LoadedKernel>,
    buffers: Vec<Buffer>,
    _device: xrt_sys::Device,
}

impl XrtDevice {
    /// Opens device `index`, registers every xclbin the manifest names and opens its
    /// kernels; instruction streams are uploaded once.
    pub fn open(manifest: KernelManifest, index: u32) -> Result<XrtDevice> {
        let device = xrt_sys::Device::open(index).map_err(xrt_error)?;
        let name = device.name().map_err(xrt_error)?;
        let mut contexts: HashMap<PathBuf, Context> = HashMap::new();
        let mut kernels = HashMap::new();
        for (op, entry) in manifest.kernels {
            if !contexts.contains_key(&entry.xclbin) {
                let context = device.open_context(&entry.xclbin).map_err(xrt_error)?;
                contexts.insert(entry.xclbin.clone(), context);
            }
            let context = &contexts[&entry.xclbin];
            let kernel = match &entry.code {
                KernelCode::Elf(elf) => context.kernel_from_elf(elf, &entry.kernel),
                KernelCode::Instructions(_) | KernelCode::Xclbin => context.kernel(&entry.kernel),
            }
            .map_err(xrt_error)?;
            let instructions = match &entry.code {
                KernelCode::Instructions(path) => {
                    let words = load_instructions(path)
                        .map_err(|p| TargetError::Unsupported(format!("npu: {p}")))?;
                    let arg = entry
                        .args
                        .iter()
                        .position(|a| *a == KernelArg::Instructions)
                        .unwrap_or(1) as u32;
                    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                    let mut bo = kernel
                        .alloc(bytes.len(), BufferKind::Cacheable, arg)
                        .map_err(xrt_error)?;
                    bo.write(0, &bytes).map_err(xrt_error)?;
                    Some((bo, words.len() as u32))
                }
                _ => None,
            };
            kernels.insert(
                op,
                LoadedKernel {
                    entry,
                    kernel,
                    instructions,
                },
            );
        }
        if kernels.is_empty() {
            return Err(TargetError::Unsupported(
                "npu: the kernel manifest lists no kernels".into(),
            ));
        }
        Ok(XrtDevice {
            index,
            name,
            contexts,
            kernels,
            buffers: Vec::new(),
            _device: device,
        })
    }

    fn kernel_for(&self, op: &Op) -> Result<&LoadedKernel> {
        self.kernels.get(op.kind()).ok_or_else(|| {
            TargetError::Unsupported(format!(
                "npu: the kernel manifest has no kernel for op '{}'",
                op.kind()
            ))
        })
    }

    fn prepare_run(
        &self,
        op: &Op,
        geometry: &Geometry,
        pass: PassArgs,
    ) -> Result<(xrt_sys::Run, u32)> {
        let loaded = self.kernel_for(op)?;
        let mut run = loaded.kernel.run().map_err(xrt_error)?;
        let buffers = op.buffers();
        let scalars = op.scalars(geometry, pass);
        for (i, arg) in loaded.entry.args.iter().enumerate() {
            let i = i as u32;
            match arg {
                KernelArg::Opcode(code) => run.set_u64(i, *code),
                KernelArg::Instructions => run.set_buffer(
                    i,
                    &loaded.instructions.as_ref().expect("manifest checked").0,
                ),
                KernelArg::InstructionWords => {
                    run.set_u32(i, loaded.instructions.as_ref().expect("manifest checked").1)
                }
                KernelArg::Buffer(name) => {
                    let id = buffers
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|&(_, id)| id)
                        .expect("manifest checked");
                    run.set_buffer(i, &self.buffers[id])
                }
                KernelArg::Scalar(name) => {
                    let value = scalars
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|&(_, v)| v)
                        .expect("manifest checked");
                    let value = u32::try_from(value).map_err(|_| {
                        TargetError::Unsupported(format!(
                            "npu: scalar {name} = {value} of op {} does not fit 32 bits",
                            op.kind()
                        ))
                    })?;
                    run.set_u32(i, value)
                }
            }
            .map_err(xrt_error)?;
        }
        Ok((run, loaded.entry.timeout_ms))
    }
}

impl Device for XrtDevice {
    fn describe(&self) -> String {
        format!(
            "xrt device {}: {} (XRT {})",
            self.index,
            self.name,
            xrt_sys::xrt_version()
        )
    }

    fn allocate(&mut self, buffers: &[BufferSpec], ops: &[Op]) -> Result<()> {
        self.buffers.clear();
        for (id, spec) in buffers.iter().enumerate() {
            // Place each buffer in the memory group of its first binding.
            let binding = ops.iter().find_map(|op| {
                let (name, _) = op.buffers().into_iter().find(|&(_, b)| b == id)?;
                let loaded = self.kernels.get(op.kind())?;
                let arg = loaded
                    .entry
                    .args
                    .iter()
                    .position(|a| *a == KernelArg::Buffer(name.into()))?;
                Some((loaded, arg as u32))
            });
            let (kernel, arg) = match binding {
                Some((loaded, arg)) => (&loaded.kernel, arg),
                None => {
                    let any = self
                        .kernels
                        .values()
                        .next()
                        .ok_or_else(|| TargetError::Unsupported("npu: no kernels".into()))?;
                    (&any.kernel, 3)
                }
            };
            let size = spec.bytes.max(4);
            let bo = kernel.alloc(size, BufferKind::HostOnly, arg).map_err(|e| {
                TargetError::Unsupported(format!(
                    "npu: buffer {} ({} bytes): {e}",
                    spec.name, spec.bytes
                ))
            })?;
            self.buffers.push(bo);
        }
        Ok(())
    }

    fn write(&mut self, buffer: BufferId, offset: usize, bytes: &[u8]) -> Result<()> {
        let bo = self
            .buffers
            .get_mut(buffer)
            .ok_or_else(|| TargetError::Unsupported(format!("npu: no buffer {buffer}")))?;
        bo.write(offset, bytes).map_err(xrt_error)
    }

    fn read(&mut self, buffer: BufferId, offset: usize, out: &mut [u8]) -> Result<()> {
        let bo = self
            .buffers
            .get_mut(buffer)
            .ok_or_else(|| TargetError::Unsupported(format!("npu: no buffer {buffer}")))?;
        bo.read(offset, out).map_err(xrt_error)
    }

    fn run(&mut self, op: &Op, geometry: &Geometry, pass: PassArgs) -> Result<()> {
        let (mut run, timeout) = self.prepare_run(op, geometry, pass)?;
        run.execute(timeout).map_err(xrt_error)
    }

    fn run_all(&mut self, ops: &[&Op], geometry: &Geometry, pass: PassArgs) -> Result<()> {
        // One runlist per pass when every kernel lives in one xclbin (a runlist belongs
        // to one context): the ops run in order without a host round trip each.
        let mut contexts = ops
            .iter()
            .map(|op| self.kernel_for(op).map(|k| &k.entry.xclbin));
        let Some(first) = contexts.next().transpose()? else {
            return Ok(());
        };
        if contexts.any(|c| c.map_or(true, |c| c != first)) {
            for op in ops {
                self.run(op, geometry, pass)?;
            }
            return Ok(());
        }
        let mut list = self.contexts[first].runlist().map_err(xrt_error)?;
        let mut runs = Vec::with_capacity(ops.len());
        let mut timeout = 0u32;
        for op in ops {
            let (run, t) = self.prepare_run(op, geometry, pass)?;
            list.add(&run).map_err(xrt_error)?;
            timeout = timeout.saturating_add(t);
            runs.push(run);
        }
        list.execute(timeout).map_err(xrt_error)
    }
}
