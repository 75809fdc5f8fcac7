//! Is there a usable NPU here? Looks for `/dev/accel/accel*` nodes and the driver
//! bound to each (`/sys/class/accel/accelN/device/driver`), and says why the NPU
//! backend can or cannot run. Roots are parameters so tests can build fake trees.

use std::path::{Path, PathBuf};

/// The driver of AMD's Ryzen AI NPUs.
pub const NPU_DRIVER: &str = "amdxdna";

/// What the NPU backend says when onebit was built without it.
pub const BUILT_WITHOUT_XRT: &str =
    "this onebit was built without XRT support (cargo feature `xrt`)";

/// One accelerator node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccelNode {
    /// The device node (`/dev/accel/accelN`).
    pub node: PathBuf,
    /// Name of the driver bound to it, if any.
    pub driver: Option<String>,
    /// Whether this process may open it read-write.
    pub accessible: bool,
}

/// The finding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpuPresence {
    /// Every accelerator node found, sorted by path.
    pub nodes: Vec<AccelNode>,
    /// Whether this onebit was built with XRT support.
    pub xrt_built: bool,
    /// Whether the NPU backend can run here.
    pub usable: bool,
    /// Why or why not, one sentence for people.
    pub reason: String,
}

/// Probes `dev_root/accel` and `sys_root/class/accel` (normally `/dev` and `/sys`).
pub fn probe(dev_root: &Path, sys_root: &Path, xrt_built: bool) -> NpuPresence {
    let mut nodes = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dev_root.join("accel")) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("accel") {
                continue;
            }
            let driver = std::fs::read_link(
                sys_root
                    .join("class/accel")
                    .join(&name)
                    .join("device/driver"),
            )
            .ok()
            .and_then(|target| target.file_name().map(|n| n.to_string_lossy().into_owned()));
            let accessible = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(entry.path())
                .is_ok();
            nodes.push(AccelNode {
                node: entry.path(),
                driver,
                accessible,
            });
        }
    }
    nodes.sort_by(|a, b| a.node.cmp(&b.node));
    let npu = nodes
        .iter()
        .find(|n| n.driver.as_deref() == Some(NPU_DRIVER));
    let (usable, reason) = match npu {
        None if nodes.is_empty() => (
            false,
            format!(
                "no {}/accel device: no NPU driver is loaded (Ryzen AI needs the {NPU_DRIVER} driver: Linux 6.14 or newer, or amdxdna-dkms)",
                dev_root.display()
            ),
        ),
        None => (
            false,
            format!(
                "accelerator nodes exist ({}) but none is bound to {NPU_DRIVER}",
                nodes
                    .iter()
                    .map(|n| format!("{} → {}", n.node.display(), n.driver.as_deref().unwrap_or("no driver")))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        Some(n) if !n.accessible => (
            false,
            format!(
                "{} ({NPU_DRIVER}) cannot be opened read-write by this user: add the user to the render group or fix the node's permissions",
                n.node.display()
            ),
        ),
        Some(_) if !xrt_built => (false, format!("an {NPU_DRIVER} NPU is present, but {BUILT_WITHOUT_XRT}")),
        Some(n) => (true, format!("{} is bound to {NPU_DRIVER} and this onebit has XRT support", n.node.display())),
    };
    NpuPresence {
        nodes,
        xrt_built,
        usable,
        reason,
    }
}

/// [`probe`] of this machine.
pub fn probe_this_machine() -> NpuPresence {
    probe(Path::new("/dev"), Path::new("/sys"), xrt_sys::ENABLED)
}
