//! Devices execute a plan's ops over their own buffers. [`SimDevice`] is the
//! simulated NPU: host buffers and the CPU kernels, one op at a time, exactly as a
//! device would be driven (bytes in, bytes out, nothing shared with the host).

use super::pack::unpack_tiles;
use super::plan::{BufferId, BufferSpec, Elem, Geometry, Op, PassArgs};
use crate::error::{Result, TargetError};
use crate::kernels::{self, Isa};

/// The CPU backend's attention (`kernels::attention`, f32 KV) of `n` query rows at
/// positions `p0..` over a plan's KV buffers (`[kv_head][capacity][head_dim]`, f32): the
/// positions `0..p0 + n` are copied into the kernels' KV layout first, so the sim gives
/// the CPU backend's bits at `--kv-type f32`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_over_rows(
    isa: Isa,
    g: &Geometry,
    p0: usize,
    n: usize,
    queries: &[f32],
    keys: &[f32],
    values: &[f32],
    out: &mut [f32],
) {
    let (hd, kvh, len) = (g.head_dim, g.num_kv_heads, p0 + n);
    let mut layer = kernels::kv::KvLayer::new(kernels::kv::KvType::F32, kvh, hd);
    let (mut k, mut v) = (Vec::with_capacity(kvh * hd), Vec::with_capacity(kvh * hd));
    for t in 0..len {
        k.clear();
        v.clear();
        for kh in 0..kvh {
            let at = (kh * g.capacity + t) * hd;
            k.extend_from_slice(&keys[at..at + hd]);
            v.extend_from_slice(&values[at..at + hd]);
        }
        layer.append(&k, &v, 1);
    }
    let scale = 1.0 / (hd as f32).sqrt();
    kernels::attention::attention(isa, &layer, queries, n, p0, g.num_heads, scale, out);
}

/// What the NPU backend needs from a device.
pub trait Device {
    /// A short description ("sim (avx512)", "xrt device 0: RyzenAI-npu4").
    fn describe(&self) -> String;
    /// Allocates every buffer of a plan (indices are [`BufferId`]s); `ops` are all
    /// the ops that will run, for devices that place buffers by their first use.
    fn allocate(&mut self, buffers: &[BufferSpec], ops: &[Op]) -> Result<()>;
    /// Host → device: `bytes` at byte `offset` of `buffer`.
    fn write(&mut self, buffer: BufferId, offset: usize, bytes: &[u8]) -> Result<()>;
    /// Device → host: `out.len()` bytes at byte `offset` of `buffer`.
    fn read(&mut self, buffer: BufferId, offset: usize, out: &mut [u8]) -> Result<()>;
    /// Runs one op.
    fn run(&mut self, op: &Op, geometry: &Geometry, pass: PassArgs) -> Result<()>;
    /// Runs a pass's ops in order (a device may batch them, e.g. as an XRT runlist).
    fn run_all(&mut self, ops: &[&Op], geometry: &Geometry, pass: PassArgs) -> Result<()> {
        for op in ops {
            self.run(op, geometry, pass)?;
        }
        Ok(())
    }
}

enum HostBuffer {
    Bytes(Vec<u8>),
    Floats(Vec<f32>),
}

/// The simulated device.
pub struct SimDevice {
    kernel: Isa,
    buffers: Vec<HostBuffer>,
    names: Vec<String>,
}

fn sim_error(message: String) -> TargetError {
    TargetError::Unsupported(format!("npu sim: {message}"))
}

impl SimDevice {
    /// A simulated device using `kernel` for its matmuls.
    pub fn new(kernel: Isa) -> SimDevice {
        SimDevice {
            kernel,
            buffers: Vec::new(),
            names: Vec::new(),
        }
    }

    fn bytes(&self, id: BufferId) -> Result<&[u8]> {
        match self.buffers.get(id) {
            Some(HostBuffer::Bytes(b)) => Ok(b),
            Some(HostBuffer::Floats(_)) => Err(sim_error(format!(
                "buffer {} holds f32, not bytes",
                self.names[id]
            ))),
            None => Err(sim_error(format!("no buffer {id}"))),
        }
    }

    fn floats(&self, id: BufferId) -> Result<&[f32]> {
        match self.buffers.get(id) {
            Some(HostBuffer::Floats(f)) => Ok(f),
            Some(HostBuffer::Bytes(_)) => Err(sim_error(format!(
                "buffer {} holds bytes, not f32",
                self.names[id]
            ))),
            None => Err(sim_error(format!("no buffer {id}"))),
        }
    }

    /// Takes an f32 buffer out so it can be written while others are read.
    fn take(&mut self, id: BufferId) -> Result<Vec<f32>> {
        match self.buffers.get_mut(id) {
            Some(HostBuffer::Floats(f)) => Ok(std::mem::take(f)),
            Some(HostBuffer::Bytes(_)) => Err(sim_error(format!(
                "buffer {} holds bytes, not f32",
                self.names[id]
            ))),
            None => Err(sim_error(format!("no buffer {id}"))),
        }
    }

    fn put(&mut self, id: BufferId, values: Vec<f32>) {
        self.buffers[id] = HostBuffer::Floats(values);
    }

    fn rows<'b>(
        &self,
        values: &'b [f32],
        id: BufferId,
        rows: usize,
        width: usize,
    ) -> Result<&'b [f32]> {
        values.get(..rows * width).ok_or_else(|| {
            sim_error(format!(
                "{} rows of {width} overrun buffer {}",
                rows, self.names[id]
            ))
        })
    }

    fn execute(&mut self, op: &Op, g: &Geometry, pass: PassArgs) -> Result<()> {
        let n = pass.rows;
        let hd = g.head_dim;
        match *op {
            Op::Embed { table, tokens, out } => {
                // Check every id before taking the output buffer, so a refused pass
                // leaves the device usable.
                let ids: Vec<usize> = self
                    .bytes(tokens)?
                    .chunks_exact(4)
                    .take(n)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
                    .collect();
                if let Some(&t) = ids.iter().find(|&&t| t >= g.vocab) {
                    return Err(sim_error(format!(
                        "token {t} outside the vocabulary of {}",
                        g.vocab
                    )));
                }
                let mut y = self.take(out)?;
                let table = self.bytes(table)?;
                for (i, &t) in ids.iter().enumerate() {
                    let row = &table[t * g.hidden * 2..(t + 1) * g.hidden * 2];
                    for (dst, b) in y[i * g.hidden..(i + 1) * g.hidden]
                        .iter_mut()
                        .zip(row.chunks_exact(2))
                    {
                        *dst = half::bf16::from_le_bytes([b[0], b[1]]).to_f32();
                    }
                }
                self.put(out, y);
            }
            Op::RmsNorm {
                x,
                gain,
                out,
                width,
            } => {
                let mut y = self.take(out)?;
                let xs = self.rows(self.floats(x)?, x, n, width)?;
                let gain = &self.floats(gain)?[..width];
                kernels::rms_norm(xs, gain, g.rms_eps, &mut y[..n * width]);
                self.put(out, y);
            }
            Op::MatMulQ4 {
                weight,
                w_rows,
                w_cols,
                x,
                out,
            } => {
                let mut y = self.take(out)?;
                let w = unpack_tiles(&self.names[weight], self.bytes(weight)?, w_rows, w_cols)?;
                let xs = self.rows(self.floats(x)?, x, n, w_cols)?;
                kernels::matmul(&w, xs, n, &mut y[..n * w_rows], self.kernel);
                self.put(out, y);
            }
            Op::MatMulBf16 {
                table,
                w_rows,
                w_cols,
                x,
                out,
            } => {
                let mut y = self.take(out)?;
                let t = &self.bytes(table)?[..w_rows * w_cols * 2];
                let xs = self.rows(self.floats(x)?, x, n, w_cols)?;
                kernels::dense::matmul_bf16(
                    t,
                    w_rows,
                    w_cols,
                    xs,
                    n,
                    &mut y[..n * w_rows],
                    self.kernel,
                );
                self.put(out, y);
            }
            Op::NormRope {
                x,
                heads,
                gain,
                rope,
            } => {
                let mut xs = self.take(x)?;
                let table = self.floats(rope)?;
                let (cos, sin) = table.split_at(table.len() / 2);
                let gain = match gain {
                    Some(id) => Some(&self.floats(id)?[..hd]),
                    None => None,
                };
                kernels::norm_and_rope(
                    &mut xs[..n * heads * hd],
                    heads,
                    hd,
                    gain,
                    g.rms_eps,
                    pass.position,
                    cos,
                    sin,
                );
                self.put(x, xs);
            }
            Op::KvAppend { k, v, keys, values } => {
                for (src, dst) in [(k, keys), (v, values)] {
                    let mut cache = self.take(dst)?;
                    let rows = self.floats(src)?;
                    for i in 0..n {
                        for kh in 0..g.num_kv_heads {
                            let from = i * g.num_kv_heads * hd + kh * hd;
                            let to = (kh * g.capacity + pass.position + i) * hd;
                            cache[to..to + hd].copy_from_slice(&rows[from..from + hd]);
                        }
                    }
                    self.put(dst, cache);
                }
            }
            Op::Attention {
                q,
                keys,
                values,
                out,
            } => {
                let mut y = self.take(out)?;
                let (qs, ks, vs) = (self.floats(q)?, self.floats(keys)?, self.floats(values)?);
                let q_dim = g.num_heads * hd;
                attention_over_rows(
                    self.kernel,
                    g,
                    pass.position,
                    n,
                    &qs[..n * q_dim],
                    ks,
                    vs,
                    &mut y[..n * q_dim],
                );
                self.put(out, y);
            }
            Op::Add { x, y, width } => {
                let mut xs = self.take(x)?;
                let ys = self.floats(y)?;
                for (a, b) in xs[..n * width].iter_mut().zip(&ys[..n * width]) {
                    *a += b;
                }
                self.put(x, xs);
            }
            Op::SwiGlu { gate, up, width } => {
                let mut gs = self.take(gate)?;
                let us = self.floats(up)?;
                kernels::swiglu(self.kernel, &mut gs[..n * width], &us[..n * width]);
                self.put(gate, gs);
            }
            Op::TapCopy { from, to, slot } => {
                let mut taps = self.take(to)?;
                let xs = self.floats(from)?;
                let (h, w) = (g.hidden, g.hidden * g.taps);
                for i in 0..n {
                    taps[i * w + slot * h..i * w + (slot + 1) * h]
                        .copy_from_slice(&xs[i * h..(i + 1) * h]);
                }
                self.put(to, taps);
            }
        }
        Ok(())
    }
}

impl Device for SimDevice {
    fn describe(&self) -> String {
        format!("sim ({} kernels on the host)", self.kernel.name())
    }

    fn allocate(&mut self, buffers: &[BufferSpec], _ops: &[Op]) -> Result<()> {
        self.buffers = buffers
            .iter()
            .map(|spec| match spec.elem {
                Elem::Bytes => HostBuffer::Bytes(vec![0; spec.bytes]),
                Elem::F32 => HostBuffer::Floats(vec![0.0; spec.bytes / 4]),
            })
            .collect();
        self.names = buffers.iter().map(|b| b.name.clone()).collect();
        Ok(())
    }

    fn write(&mut self, buffer: BufferId, offset: usize, bytes: &[u8]) -> Result<()> {
        let name = self.names.get(buffer).cloned().unwrap_or_default();
        let overrun = || {
            sim_error(format!(
                "write of {} bytes at {offset} overruns buffer {name}",
                bytes.len()
            ))
        };
        match self.buffers.get_mut(buffer) {
            Some(HostBuffer::Bytes(b)) => {
                let end = offset.checked_add(bytes.len()).ok_or_else(overrun)?;
                b.get_mut(offset..end)
                    .ok_or_else(overrun)?
                    .copy_from_slice(bytes);
            }
            Some(HostBuffer::Floats(f)) => {
                if !offset.is_multiple_of(4) || !bytes.len().is_multiple_of(4) {
                    return Err(sim_error(format!("unaligned write to f32 buffer {name}")));
                }
                let dst = f
                    .get_mut(offset / 4..offset / 4 + bytes.len() / 4)
                    .ok_or_else(overrun)?;
                for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                    *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            None => return Err(sim_error(format!("no buffer {buffer}"))),
        }
        Ok(())
    }

    fn read(&mut self, buffer: BufferId, offset: usize, out: &mut [u8]) -> Result<()> {
        let name = self.names.get(buffer).cloned().unwrap_or_default();
        let overrun = || {
            sim_error(format!(
                "read of {} bytes at {offset} overruns buffer {name}",
                out.len()
            ))
        };
        match self.buffers.get(buffer) {
            Some(HostBuffer::Bytes(b)) => {
                let end = offset.checked_add(out.len()).ok_or_else(overrun)?;
                out.copy_from_slice(b.get(offset..end).ok_or_else(overrun)?);
            }
            Some(HostBuffer::Floats(f)) => {
                if !offset.is_multiple_of(4) || !out.len().is_multiple_of(4) {
                    return Err(sim_error(format!("unaligned read from f32 buffer {name}")));
                }
                let src = f
                    .get(offset / 4..offset / 4 + out.len() / 4)
                    .ok_or_else(overrun)?;
                for (o, v) in out.chunks_exact_mut(4).zip(src) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            None => return Err(sim_error(format!("no buffer {buffer}"))),
        }
        Ok(())
    }

    fn run(&mut self, op: &Op, geometry: &Geometry, pass: PassArgs) -> Result<()> {
        self.execute(op, geometry, pass)
    }
}
