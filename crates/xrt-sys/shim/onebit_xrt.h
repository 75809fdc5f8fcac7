/*
 * onebit_xrt.h: a C ABI over XRT's C++ API, for the onebit NPU backend.
 *
 * Why a shim: XRT's C API loads xclbins with load_axlf, which the Ryzen AI
 * (amdxdna) driver does not support; only the C++ API's
 * xrt::device::register_xclbin + xrt::hw_context works there.
 *
 * Rules of this ABI:
 *  - every function returns OBX_OK (0) or a negative OBX_E_* code; on error,
 *    obx_last_error() returns a message for the calling thread (valid until the
 *    next call on that thread);
 *  - no C++ exception crosses this boundary;
 *  - handles are opaque; each *_open / *_create / *_alloc pairs with one *_close /
 *    *_free, which accept NULL. A context keeps its device alive, a kernel its
 *    context, a buffer its device, a run its kernel (reference counted inside).
 */
#ifndef ONEBIT_XRT_H
#define ONEBIT_XRT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum obx_status {
  OBX_OK = 0,
  OBX_E_ARGUMENT = -1,  /* a NULL handle, a bad index or size */
  OBX_E_XRT = -2,       /* XRT threw; see obx_last_error() */
  OBX_E_TIMEOUT = -3,   /* a wait ran out of time */
  OBX_E_RUN_STATE = -4, /* a run finished in a state other than completed */
  OBX_E_UNKNOWN = -5    /* a non-standard exception */
};

/* Buffer placement (xrt::bo::flags). */
enum obx_bo_kind {
  OBX_BO_NORMAL = 0,
  OBX_BO_CACHEABLE = 1,
  OBX_BO_HOST_ONLY = 2
};

/* Sync direction. */
enum obx_sync {
  OBX_SYNC_TO_DEVICE = 0,
  OBX_SYNC_FROM_DEVICE = 1
};

typedef struct obx_device obx_device;
typedef struct obx_hwctx obx_hwctx;
typedef struct obx_kernel obx_kernel;
typedef struct obx_bo obx_bo;
typedef struct obx_run obx_run;
typedef struct obx_runlist obx_runlist;

/* The message of the last failed call on this thread ("" if none). */
const char* obx_last_error(void);

/* XRT's version string as compiled against, e.g. "2.19.0". */
const char* obx_xrt_version(void);

/* Devices. */
int obx_device_count(uint32_t* count);
int obx_device_open(uint32_t index, obx_device** out);
/* Writes the device name (NUL-terminated, truncated to capacity). */
int obx_device_name(const obx_device* device, char* name, size_t capacity);
void obx_device_close(obx_device* device);

/* Reads an xclbin, registers it with the device and opens a hardware context on it. */
int obx_hwctx_open_xclbin(obx_device* device, const char* xclbin_path, obx_hwctx** out);
void obx_hwctx_close(obx_hwctx* context);

/* A kernel of the context's xclbin, by name (for example "MLIR_AIE"). */
int obx_kernel_open(obx_hwctx* context, const char* name, obx_kernel** out);
/* A kernel whose instructions come from an ELF (xrt::elf, xrt::module, xrt::ext::kernel). */
int obx_kernel_open_elf(obx_hwctx* context, const char* elf_path, const char* name,
                        obx_kernel** out);
/* The memory group a buffer bound to argument `arg` must be allocated in. */
int obx_kernel_group_id(const obx_kernel* kernel, uint32_t arg, int32_t* group);
void obx_kernel_close(obx_kernel* kernel);

/* Buffers. A buffer allocated for a kernel lives in that kernel's context. */
int obx_bo_alloc(obx_kernel* kernel, size_t size, int32_t kind, int32_t group, obx_bo** out);
/* Host mapping of the whole buffer. */
int obx_bo_map(obx_bo* bo, void** host);
int obx_bo_size(const obx_bo* bo, size_t* size);
int obx_bo_sync(obx_bo* bo, int32_t direction, size_t size, size_t offset);
void obx_bo_free(obx_bo* bo);

/* Runs: set arguments, start, wait. */
int obx_run_create(obx_kernel* kernel, obx_run** out);
int obx_run_set_u32(obx_run* run, uint32_t arg, uint32_t value);
int obx_run_set_u64(obx_run* run, uint32_t arg, uint64_t value);
int obx_run_set_bo(obx_run* run, uint32_t arg, obx_bo* bo);
int obx_run_start(obx_run* run);
/* Waits up to timeout_ms (0: forever); OBX_E_TIMEOUT or OBX_E_RUN_STATE otherwise. */
int obx_run_wait(obx_run* run, uint32_t timeout_ms);
void obx_run_free(obx_run* run);

/* Runlists: several runs submitted to the context as one batch. */
int obx_runlist_create(obx_hwctx* context, obx_runlist** out);
int obx_runlist_add(obx_runlist* list, obx_run* run);
int obx_runlist_execute(obx_runlist* list);
int obx_runlist_wait(obx_runlist* list, uint32_t timeout_ms);
int obx_runlist_reset(obx_runlist* list);
void obx_runlist_free(obx_runlist* list);

#ifdef __cplusplus
}
#endif

#endif /* ONEBIT_XRT_H */
