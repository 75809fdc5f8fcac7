// onebit_xrt.cpp: the C ABI of onebit_xrt.h over XRT's C++ API (XRT >= 2.17).
//
// Every entry point runs its body through `guarded`, which turns any exception into
// a status code and a thread-local message, so no C++ exception reaches Rust.

#include "onebit_xrt.h"

#include <chrono>
#include <cstring>
#include <exception>
#include <string>
#include <utility>

#include "xrt/xrt_bo.h"
#include "xrt/xrt_device.h"
#include "xrt/xrt_hw_context.h"
#include "xrt/xrt_kernel.h"
#if __has_include("xrt/experimental/xrt_ext.h")
#include "xrt/experimental/xrt_elf.h"
#include "xrt/experimental/xrt_ext.h"
#include "xrt/experimental/xrt_kernel.h"
#include "xrt/experimental/xrt_module.h"
#include "xrt/experimental/xrt_system.h"
#else
#include "experimental/xrt_elf.h"
#include "experimental/xrt_ext.h"
#include "experimental/xrt_kernel.h"
#include "experimental/xrt_module.h"
#include "experimental/xrt_system.h"
#endif

#ifndef ONEBIT_XRT_VERSION
#define ONEBIT_XRT_VERSION "unknown"
#endif

// XRT's handles (device, hw_context, kernel, bo) are shared pimpls: a copy keeps
// the object alive. So a kernel, buffer or run keeps a copy of its context and the
// C side may close handles in any order.
struct obx_device {
  xrt::device device;
};
struct obx_hwctx {
  xrt::device device;
  xrt::hw_context context;
};
struct obx_kernel {
  xrt::hw_context context;
  xrt::kernel kernel;
};
struct obx_bo {
  xrt::hw_context context;
  xrt::bo bo;
};
struct obx_run {
  xrt::kernel kernel;
  xrt::run run;
};
struct obx_runlist {
  xrt::hw_context context;
  xrt::runlist list;
};

namespace {

thread_local std::string last_error;

int fail(int code, std::string message) {
  last_error = std::move(message);
  return code;
}

template <typename Body>
int guarded(const char* what, Body&& body) {
  try {
    last_error.clear();
    return body();
  } catch (const std::exception& e) {
    return fail(OBX_E_XRT, std::string(what) + ": " + e.what());
  } catch (...) {
    return fail(OBX_E_UNKNOWN, std::string(what) + ": unknown exception");
  }
}

int wait_state(ert_cmd_state state) {
  if (state == ERT_CMD_STATE_COMPLETED) return OBX_OK;
  if (state == ERT_CMD_STATE_TIMEOUT) return fail(OBX_E_TIMEOUT, "run did not finish in time");
  return fail(OBX_E_RUN_STATE, "run finished in state " + std::to_string(static_cast<int>(state)));
}

}  // namespace

extern "C" {

const char* obx_last_error(void) { return last_error.c_str(); }

const char* obx_xrt_version(void) { return ONEBIT_XRT_VERSION; }

int obx_device_count(uint32_t* count) {
  if (!count) return fail(OBX_E_ARGUMENT, "obx_device_count: count is NULL");
  return guarded("enumerate devices", [&] {
    *count = static_cast<uint32_t>(xrt::system::enumerate_devices());
    return OBX_OK;
  });
}

int obx_device_open(uint32_t index, obx_device** out) {
  if (!out) return fail(OBX_E_ARGUMENT, "obx_device_open: out is NULL");
  *out = nullptr;
  return guarded("open device", [&] {
    *out = new obx_device{xrt::device(index)};
    return OBX_OK;
  });
}

int obx_device_name(const obx_device* device, char* name, size_t capacity) {
  if (!device || !name || capacity == 0) return fail(OBX_E_ARGUMENT, "obx_device_name: bad argument");
  return guarded("device name", [&] {
    std::string text = device->device.get_info<xrt::info::device::name>();
    size_t n = text.size() < capacity - 1 ? text.size() : capacity - 1;
    std::memcpy(name, text.data(), n);
    name[n] = '\0';
    return OBX_OK;
  });
}

void obx_device_close(obx_device* device) { delete device; }

int obx_hwctx_open_xclbin(obx_device* device, const char* xclbin_path, obx_hwctx** out) {
  if (!device || !xclbin_path || !out) return fail(OBX_E_ARGUMENT, "obx_hwctx_open_xclbin: bad argument");
  *out = nullptr;
  return guarded(xclbin_path, [&] {
    xrt::xclbin xclbin(std::string{xclbin_path});
    auto uuid = device->device.register_xclbin(xclbin);
    *out = new obx_hwctx{device->device, xrt::hw_context(device->device, uuid)};
    return OBX_OK;
  });
}

void obx_hwctx_close(obx_hwctx* context) { delete context; }

int obx_kernel_open(obx_hwctx* context, const char* name, obx_kernel** out) {
  if (!context || !name || !out) return fail(OBX_E_ARGUMENT, "obx_kernel_open: bad argument");
  *out = nullptr;
  return guarded(name, [&] {
    xrt::kernel kernel(context->context, std::string{name});
    *out = new obx_kernel{context->context, std::move(kernel)};
    return OBX_OK;
  });
}

int obx_kernel_open_elf(obx_hwctx* context, const char* elf_path, const char* name, obx_kernel** out) {
  if (!context || !elf_path || !name || !out) return fail(OBX_E_ARGUMENT, "obx_kernel_open_elf: bad argument");
  *out = nullptr;
  return guarded(elf_path, [&] {
    xrt::elf elf(std::string{elf_path});
    xrt::module module(elf);
    xrt::ext::kernel kernel(context->context, module, std::string{name});
    *out = new obx_kernel{context->context, std::move(kernel)};
    return OBX_OK;
  });
}

int obx_kernel_group_id(const obx_kernel* kernel, uint32_t arg, int32_t* group) {
  if (!kernel || !group) return fail(OBX_E_ARGUMENT, "obx_kernel_group_id: bad argument");
  return guarded("kernel group id", [&] {
    *group = kernel->kernel.group_id(static_cast<int>(arg));
    return OBX_OK;
  });
}

void obx_kernel_close(obx_kernel* kernel) { delete kernel; }

int obx_bo_alloc(obx_kernel* kernel, size_t size, int32_t kind, int32_t group, obx_bo** out) {
  if (!kernel || !out || size == 0) return fail(OBX_E_ARGUMENT, "obx_bo_alloc: bad argument");
  *out = nullptr;
  xrt::bo::flags flags = xrt::bo::flags::normal;
  switch (kind) {
    case OBX_BO_NORMAL: break;
    case OBX_BO_CACHEABLE: flags = xrt::bo::flags::cacheable; break;
    case OBX_BO_HOST_ONLY: flags = xrt::bo::flags::host_only; break;
    default: return fail(OBX_E_ARGUMENT, "obx_bo_alloc: unknown buffer kind " + std::to_string(kind));
  }
  return guarded("allocate buffer", [&] {
    xrt::bo bo(kernel->context, size, flags, static_cast<xrt::memory_group>(group));
    *out = new obx_bo{kernel->context, std::move(bo)};
    return OBX_OK;
  });
}

int obx_bo_map(obx_bo* bo, void** host) {
  if (!bo || !host) return fail(OBX_E_ARGUMENT, "obx_bo_map: bad argument");
  return guarded("map buffer", [&] {
    *host = bo->bo.map<void*>();
    return OBX_OK;
  });
}

int obx_bo_size(const obx_bo* bo, size_t* size) {
  if (!bo || !size) return fail(OBX_E_ARGUMENT, "obx_bo_size: bad argument");
  return guarded("buffer size", [&] {
    *size = bo->bo.size();
    return OBX_OK;
  });
}

int obx_bo_sync(obx_bo* bo, int32_t direction, size_t size, size_t offset) {
  if (!bo) return fail(OBX_E_ARGUMENT, "obx_bo_sync: buffer is NULL");
  if (direction != OBX_SYNC_TO_DEVICE && direction != OBX_SYNC_FROM_DEVICE)
    return fail(OBX_E_ARGUMENT, "obx_bo_sync: unknown direction " + std::to_string(direction));
  return guarded("sync buffer", [&] {
    bo->bo.sync(direction == OBX_SYNC_TO_DEVICE ? XCL_BO_SYNC_BO_TO_DEVICE : XCL_BO_SYNC_BO_FROM_DEVICE, size, offset);
    return OBX_OK;
  });
}

void obx_bo_free(obx_bo* bo) { delete bo; }

int obx_run_create(obx_kernel* kernel, obx_run** out) {
  if (!kernel || !out) return fail(OBX_E_ARGUMENT, "obx_run_create: bad argument");
  *out = nullptr;
  return guarded("create run", [&] {
    *out = new obx_run{kernel->kernel, xrt::run(kernel->kernel)};
    return OBX_OK;
  });
}

int obx_run_set_u32(obx_run* run, uint32_t arg, uint32_t value) {
  if (!run) return fail(OBX_E_ARGUMENT, "obx_run_set_u32: run is NULL");
  return guarded("set scalar argument", [&] {
    run->run.set_arg(static_cast<int>(arg), value);
    return OBX_OK;
  });
}

int obx_run_set_u64(obx_run* run, uint32_t arg, uint64_t value) {
  if (!run) return fail(OBX_E_ARGUMENT, "obx_run_set_u64: run is NULL");
  return guarded("set scalar argument", [&] {
    run->run.set_arg(static_cast<int>(arg), value);
    return OBX_OK;
  });
}

int obx_run_set_bo(obx_run* run, uint32_t arg, obx_bo* bo) {
  if (!run || !bo) return fail(OBX_E_ARGUMENT, "obx_run_set_bo: bad argument");
  return guarded("set buffer argument", [&] {
    run->run.set_arg(static_cast<int>(arg), bo->bo);
    return OBX_OK;
  });
}

int obx_run_start(obx_run* run) {
  if (!run) return fail(OBX_E_ARGUMENT, "obx_run_start: run is NULL");
  return guarded("start run", [&] {
    run->run.start();
    return OBX_OK;
  });
}

int obx_run_wait(obx_run* run, uint32_t timeout_ms) {
  if (!run) return fail(OBX_E_ARGUMENT, "obx_run_wait: run is NULL");
  return guarded("wait for run", [&] {
    auto state = run->run.wait(std::chrono::milliseconds(timeout_ms));
    return wait_state(state);
  });
}

void obx_run_free(obx_run* run) { delete run; }

int obx_runlist_create(obx_hwctx* context, obx_runlist** out) {
  if (!context || !out) return fail(OBX_E_ARGUMENT, "obx_runlist_create: bad argument");
  *out = nullptr;
  return guarded("create runlist", [&] {
    *out = new obx_runlist{context->context, xrt::runlist(context->context)};
    return OBX_OK;
  });
}

int obx_runlist_add(obx_runlist* list, obx_run* run) {
  if (!list || !run) return fail(OBX_E_ARGUMENT, "obx_runlist_add: bad argument");
  return guarded("add to runlist", [&] {
    list->list.add(run->run);
    return OBX_OK;
  });
}

int obx_runlist_execute(obx_runlist* list) {
  if (!list) return fail(OBX_E_ARGUMENT, "obx_runlist_execute: list is NULL");
  return guarded("execute runlist", [&] {
    list->list.execute();
    return OBX_OK;
  });
}

int obx_runlist_wait(obx_runlist* list, uint32_t timeout_ms) {
  if (!list) return fail(OBX_E_ARGUMENT, "obx_runlist_wait: list is NULL");
  return guarded("wait for runlist", [&] {
    if (timeout_ms == 0) {
      list->list.wait();
      return OBX_OK;
    }
    auto status = list->list.wait(std::chrono::milliseconds(timeout_ms));
    if (status == std::cv_status::timeout) return fail(OBX_E_TIMEOUT, "runlist did not finish in time");
    return OBX_OK;
  });
}

int obx_runlist_reset(obx_runlist* list) {
  if (!list) return fail(OBX_E_ARGUMENT, "obx_runlist_reset: list is NULL");
  return guarded("reset runlist", [&] {
    list->list.reset();
    return OBX_OK;
  });
}

void obx_runlist_free(obx_runlist* list) { delete list; }

}  // extern "C"
