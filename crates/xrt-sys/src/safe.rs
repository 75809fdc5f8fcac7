//! Owned wrappers over the shim's handles. Each wrapper frees its handle on drop;
//! the shim keeps parents alive for children, so drop order does not matter.

use std::ffi::{c_void, CStr, CString};
use std::path::Path;
use std::ptr::NonNull;

use crate::ffi;

/// An XRT failure: the shim's status code and message, with what onebit was doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XrtError {
    /// What onebit was doing when XRT failed (e.g. "open device 0").
    pub doing: String,
    /// The shim's status code (non-zero).
    pub code: i32,
    /// XRT's own message, as the shim caught it.
    pub message: String,
}

impl std::fmt::Display for XrtError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "xrt: {}: {} (code {})",
            self.doing, self.message, self.code
        )
    }
}

impl std::error::Error for XrtError {}

/// A result whose error is an [`XrtError`].
pub type Result<T> = std::result::Result<T, XrtError>;

fn check(status: i32, doing: impl FnOnce() -> String) -> Result<()> {
    if status == ffi::obx_status::OBX_OK as i32 {
        return Ok(());
    }
    // SAFETY: obx_last_error returns a NUL-terminated thread-local string that stays
    // valid until the next shim call on this thread; it is copied at once.
    let message = unsafe { CStr::from_ptr(ffi::obx_last_error()) }
        .to_string_lossy()
        .into_owned();
    Err(XrtError {
        doing: doing(),
        code: status,
        message,
    })
}

fn c_string(text: &str, doing: &str) -> Result<CString> {
    CString::new(text).map_err(|_| XrtError {
        doing: doing.into(),
        code: ffi::obx_status::OBX_E_ARGUMENT as i32,
        message: format!("'{text}' contains a NUL byte"),
    })
}

fn c_path(path: &Path, doing: &str) -> Result<CString> {
    c_string(&path.to_string_lossy(), doing)
}

/// XRT's version as the shim was compiled against.
pub fn xrt_version() -> String {
    // SAFETY: a static NUL-terminated string.
    unsafe { CStr::from_ptr(ffi::obx_xrt_version()) }
        .to_string_lossy()
        .into_owned()
}

/// Number of XRT devices.
pub fn device_count() -> Result<u32> {
    let mut count = 0u32;
    // SAFETY: `count` is a valid out-pointer.
    check(unsafe { ffi::obx_device_count(&mut count) }, || {
        "count devices".into()
    })?;
    Ok(count)
}

macro_rules! handle {
    ($name:ident, $raw:ty, $free:path, $doc:literal) => {
        #[doc = $doc]
        pub struct $name(NonNull<$raw>);
        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: the handle came from the matching open/create and is freed once.
                unsafe { $free(self.0.as_ptr()) }
            }
        }
        // SAFETY: XRT objects may move between threads; the shim holds no thread affinity
        // other than the last-error string, which is read on the calling thread.
        unsafe impl Send for $name {}
    };
}

handle!(
    Device,
    ffi::obx_device,
    ffi::obx_device_close,
    "An opened XRT device."
);
handle!(
    Context,
    ffi::obx_hwctx,
    ffi::obx_hwctx_close,
    "A hardware context on a registered xclbin."
);
handle!(
    Kernel,
    ffi::obx_kernel,
    ffi::obx_kernel_close,
    "A kernel in a context."
);
handle!(Buffer, ffi::obx_bo, ffi::obx_bo_free, "A buffer object.");
handle!(
    Run,
    ffi::obx_run,
    ffi::obx_run_free,
    "One kernel invocation."
);
handle!(
    RunList,
    ffi::obx_runlist,
    ffi::obx_runlist_free,
    "Runs submitted as one batch."
);

fn non_null<T>(raw: *mut T, doing: &str) -> Result<NonNull<T>> {
    NonNull::new(raw).ok_or_else(|| XrtError {
        doing: doing.into(),
        code: ffi::obx_status::OBX_E_UNKNOWN as i32,
        message: "the shim returned success with a NULL handle".into(),
    })
}

/// Where a buffer lives (XRT's `xrt::bo::flags`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferKind {
    /// Device memory synced explicitly (`xrt::bo::flags::normal`).
    Normal,
    /// Host-cacheable device memory (`xrt::bo::flags::cacheable`).
    Cacheable,
    /// Host memory the device reads directly (`xrt::bo::flags::host_only`).
    HostOnly,
}

impl Device {
    /// Opens device `index`.
    pub fn open(index: u32) -> Result<Device> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        check(unsafe { ffi::obx_device_open(index, &mut raw) }, || {
            format!("open device {index}")
        })?;
        Ok(Device(non_null(raw, "open device")?))
    }

    /// The device's name.
    pub fn name(&self) -> Result<String> {
        let mut buffer = vec![0u8; 256];
        // SAFETY: the buffer has the stated capacity and the shim NUL-terminates.
        check(
            unsafe {
                ffi::obx_device_name(self.0.as_ptr(), buffer.as_mut_ptr().cast(), buffer.len())
            },
            || "device name".into(),
        )?;
        let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
        Ok(String::from_utf8_lossy(&buffer[..end]).into_owned())
    }

    /// Reads `xclbin`, registers it and opens a hardware context on it.
    pub fn open_context(&self, xclbin: &Path) -> Result<Context> {
        let doing = format!("register {}", xclbin.display());
        let path = c_path(xclbin, &doing)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid handle, NUL-terminated path, valid out-pointer.
        check(
            unsafe { ffi::obx_hwctx_open_xclbin(self.0.as_ptr(), path.as_ptr(), &mut raw) },
            || doing.clone(),
        )?;
        Ok(Context(non_null(raw, &doing)?))
    }
}

impl Context {
    /// A kernel of the context's xclbin by name (for example `MLIR_AIE`).
    pub fn kernel(&self, name: &str) -> Result<Kernel> {
        let doing = format!("open kernel {name}");
        let c_name = c_string(name, &doing)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid handle, NUL-terminated name, valid out-pointer.
        check(
            unsafe { ffi::obx_kernel_open(self.0.as_ptr(), c_name.as_ptr(), &mut raw) },
            || doing.clone(),
        )?;
        Ok(Kernel(non_null(raw, &doing)?))
    }

    /// A kernel whose instructions come from an ELF module.
    pub fn kernel_from_elf(&self, elf: &Path, name: &str) -> Result<Kernel> {
        let doing = format!("open kernel {name} from {}", elf.display());
        let c_elf = c_path(elf, &doing)?;
        let c_name = c_string(name, &doing)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid handle, NUL-terminated strings, valid out-pointer.
        check(
            unsafe {
                ffi::obx_kernel_open_elf(self.0.as_ptr(), c_elf.as_ptr(), c_name.as_ptr(), &mut raw)
            },
            || doing.clone(),
        )?;
        Ok(Kernel(non_null(raw, &doing)?))
    }

    /// An empty runlist on this context.
    pub fn runlist(&self) -> Result<RunList> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid handle and out-pointer.
        check(
            unsafe { ffi::obx_runlist_create(self.0.as_ptr(), &mut raw) },
            || "create runlist".into(),
        )?;
        Ok(RunList(non_null(raw, "create runlist")?))
    }
}

impl Kernel {
    /// The memory group of argument `arg`.
    pub fn group_id(&self, arg: u32) -> Result<i32> {
        let mut group = 0i32;
        // SAFETY: valid handle and out-pointer.
        check(
            unsafe { ffi::obx_kernel_group_id(self.0.as_ptr(), arg, &mut group) },
            || format!("memory group of argument {arg}"),
        )?;
        Ok(group)
    }

    /// A buffer of `size` bytes for argument `arg` of this kernel.
    pub fn alloc(&self, size: usize, kind: BufferKind, arg: u32) -> Result<Buffer> {
        let group = self.group_id(arg)?;
        let kind_code = match kind {
            BufferKind::Normal => ffi::OBX_BO_NORMAL,
            BufferKind::Cacheable => ffi::OBX_BO_CACHEABLE,
            BufferKind::HostOnly => ffi::OBX_BO_HOST_ONLY,
        } as i32;
        let mut raw = std::ptr::null_mut();
        let doing = format!("allocate {size} bytes ({kind:?}) for argument {arg}");
        // SAFETY: valid handle and out-pointer.
        check(
            unsafe { ffi::obx_bo_alloc(self.0.as_ptr(), size, kind_code, group, &mut raw) },
            || doing.clone(),
        )?;
        Ok(Buffer(non_null(raw, &doing)?))
    }

    /// A run of this kernel with no arguments set.
    pub fn run(&self) -> Result<Run> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid handle and out-pointer.
        check(
            unsafe { ffi::obx_run_create(self.0.as_ptr(), &mut raw) },
            || "create run".into(),
        )?;
        Ok(Run(non_null(raw, "create run")?))
    }
}

impl Buffer {
    /// Size in bytes.
    pub fn size(&self) -> Result<usize> {
        let mut size = 0usize;
        // SAFETY: valid handle and out-pointer.
        check(
            unsafe { ffi::obx_bo_size(self.0.as_ptr(), &mut size) },
            || "buffer size".into(),
        )?;
        Ok(size)
    }

    fn map(&self) -> Result<*mut u8> {
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid handle and out-pointer.
        check(
            unsafe { ffi::obx_bo_map(self.0.as_ptr(), &mut host) },
            || "map buffer".into(),
        )?;
        Ok(host.cast())
    }

    fn range_check(&self, offset: usize, len: usize) -> Result<()> {
        let size = self.size()?;
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(XrtError {
                doing: format!("access bytes {offset}..+{len}"),
                code: ffi::obx_status::OBX_E_ARGUMENT as i32,
                message: format!("the buffer holds {size} bytes"),
            });
        }
        Ok(())
    }

    /// Copies `bytes` into the buffer at `offset` and syncs that range to the device.
    pub fn write(&mut self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.range_check(offset, bytes.len())?;
        let host = self.map()?;
        // SAFETY: the range was checked against the buffer size; the mapping covers it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), host.add(offset), bytes.len()) };
        // SAFETY: valid handle; range checked.
        check(
            unsafe {
                ffi::obx_bo_sync(
                    self.0.as_ptr(),
                    ffi::OBX_SYNC_TO_DEVICE as i32,
                    bytes.len(),
                    offset,
                )
            },
            || "sync to device".into(),
        )
    }

    /// Syncs `out.len()` bytes at `offset` from the device and copies them out.
    pub fn read(&mut self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.range_check(offset, out.len())?;
        // SAFETY: valid handle; range checked.
        check(
            unsafe {
                ffi::obx_bo_sync(
                    self.0.as_ptr(),
                    ffi::OBX_SYNC_FROM_DEVICE as i32,
                    out.len(),
                    offset,
                )
            },
            || "sync from device".into(),
        )?;
        let host = self.map()?;
        // SAFETY: the range was checked against the buffer size; the mapping covers it.
        unsafe { std::ptr::copy_nonoverlapping(host.add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }
}

impl Run {
    /// Sets a 32-bit scalar argument.
    pub fn set_u32(&mut self, arg: u32, value: u32) -> Result<()> {
        // SAFETY: valid handle.
        check(
            unsafe { ffi::obx_run_set_u32(self.0.as_ptr(), arg, value) },
            || format!("set argument {arg} = {value}"),
        )
    }

    /// Sets a 64-bit scalar argument.
    pub fn set_u64(&mut self, arg: u32, value: u64) -> Result<()> {
        // SAFETY: valid handle.
        check(
            unsafe { ffi::obx_run_set_u64(self.0.as_ptr(), arg, value) },
            || format!("set argument {arg} = {value}"),
        )
    }

    /// Binds a buffer argument.
    pub fn set_buffer(&mut self, arg: u32, buffer: &Buffer) -> Result<()> {
        // SAFETY: valid handles; the shim keeps its own reference to the buffer.
        check(
            unsafe { ffi::obx_run_set_bo(self.0.as_ptr(), arg, buffer.0.as_ptr()) },
            || format!("bind buffer to argument {arg}"),
        )
    }

    /// Starts the run and waits up to `timeout_ms` (0: forever).
    pub fn execute(&mut self, timeout_ms: u32) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { ffi::obx_run_start(self.0.as_ptr()) }, || {
            "start run".into()
        })?;
        // SAFETY: valid handle.
        check(
            unsafe { ffi::obx_run_wait(self.0.as_ptr(), timeout_ms) },
            || format!("wait for run ({timeout_ms} ms)"),
        )
    }
}

impl RunList {
    /// Appends a run (its arguments as set now).
    pub fn add(&mut self, run: &Run) -> Result<()> {
        // SAFETY: valid handles.
        check(
            unsafe { ffi::obx_runlist_add(self.0.as_ptr(), run.0.as_ptr()) },
            || "add run to runlist".into(),
        )
    }

    /// Submits every run and waits up to `timeout_ms` (0: forever).
    pub fn execute(&mut self, timeout_ms: u32) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { ffi::obx_runlist_execute(self.0.as_ptr()) }, || {
            "execute runlist".into()
        })?;
        // SAFETY: valid handle.
        check(
            unsafe { ffi::obx_runlist_wait(self.0.as_ptr(), timeout_ms) },
            || format!("wait for runlist ({timeout_ms} ms)"),
        )
    }

    /// Empties the list so it can be filled again.
    pub fn reset(&mut self) -> Result<()> {
        // SAFETY: valid handle.
        check(unsafe { ffi::obx_runlist_reset(self.0.as_ptr()) }, || {
            "reset runlist".into()
        })
    }
}
