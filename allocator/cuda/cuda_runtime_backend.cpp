#include "allocator/cuda/cuda_runtime_backend.hpp"

#include <cuda_runtime_api.h>

#include <utility>

#include "allocator/cuda/cuda_status.hpp"
#include "allocator/cuda/device_guard.hpp"
#include "allocator/cuda/pinned_host_memory.hpp"
#include "allocator/cuda/vmm_properties.hpp"

namespace vramledger {

namespace {

cudaEvent_t as_event(EventHandle event) { return reinterpret_cast<cudaEvent_t>(event); }
cudaStream_t as_stream(StreamHandle stream) { return reinterpret_cast<cudaStream_t>(stream); }

std::string event_args(EventHandle event) { return "event=" + describe_address(event); }
std::string stream_args(StreamHandle stream) { return "stream=" + describe_address(stream); }

}  // namespace

CudaRuntimeBackend::CudaRuntimeBackend(int device, std::string name) {
  info_.name = std::move(name);
  info_.device = device;
  const DeviceGuard guard(device);
  throw_if_error(guard.status(), "vramledger: CUDA device " + std::to_string(device));
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  throw_if_error(memory_info(&free_bytes, &total_bytes),
                 "vramledger: CUDA device " + std::to_string(device));
  info_.total_bytes = total_bytes;
  // The driver rounds large cudaMalloc and pool allocations to the same 2 MiB pages VMM uses;
  // report the VMM figure when the driver gives one and keep the default otherwise.
  VmmProperties vmm;
  if (query_vmm_properties(device, &vmm).is_ok() && vmm.granularity != 0) {
    info_.granularity = vmm.granularity;
  }
}

Status CudaRuntimeBackend::memory_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  const DeviceGuard guard(info_.device);
  if (!guard.status().is_ok()) return guard.status();
  return runtime_status(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo",
                        "device=" + std::to_string(info_.device));
}

Status CudaRuntimeBackend::create_event(EventHandle* out) {
  const DeviceGuard guard(info_.device);
  if (!guard.status().is_ok()) return guard.status();
  cudaEvent_t event = nullptr;
  Status status = runtime_status(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                 "cudaEventCreateWithFlags", "flags=cudaEventDisableTiming");
  if (status.is_ok()) *out = reinterpret_cast<EventHandle>(event);
  return status;
}

Status CudaRuntimeBackend::destroy_event(EventHandle event) {
  return check_runtime(cudaEventDestroy(as_event(event)), "cudaEventDestroy",
                       [&] { return event_args(event); });
}

Status CudaRuntimeBackend::record_event(EventHandle event, StreamHandle stream) {
  return check_runtime(
      cudaEventRecord(as_event(event), as_stream(stream)), "cudaEventRecord",
      [&] { return event_args(event) + ", " + stream_args(stream); }, HandleRole::kStream);
}

Status CudaRuntimeBackend::query_event(EventHandle event, EventState* state) {
  const cudaError_t error = cudaEventQuery(as_event(event));
  if (error == cudaErrorNotReady) {
    // Not a failure; clear it so nobody mistakes it for one later.
    (void)cudaGetLastError();
    *state = EventState::kPending;
    return Status::ok();
  }
  if (error == cudaSuccess) *state = EventState::kComplete;
  return check_runtime(error, "cudaEventQuery", [&] { return event_args(event); });
}

Status CudaRuntimeBackend::synchronize_event(EventHandle event) {
  return check_runtime(cudaEventSynchronize(as_event(event)), "cudaEventSynchronize",
                       [&] { return event_args(event); });
}

Status CudaRuntimeBackend::stream_wait_event(StreamHandle stream, EventHandle event) {
  // A capturing stream may only wait on events recorded in the same capture; the policy's
  // events were recorded outside it, and a refused wait would invalidate the capture.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(as_stream(stream), &capture) != cudaSuccess) {
    (void)cudaGetLastError();  // the wait below reports what is wrong with the stream
  } else if (capture != cudaStreamCaptureStatusNone) {
    return {ErrorCode::kNotSupported,
            "cudaStreamWaitEvent: " + stream_args(stream) + " is capturing a CUDA graph"};
  }
  return check_runtime(
      cudaStreamWaitEvent(as_stream(stream), as_event(event), 0), "cudaStreamWaitEvent",
      [&] { return stream_args(stream) + ", " + event_args(event); }, HandleRole::kStream);
}

Status CudaRuntimeBackend::synchronize_device() {
  const DeviceGuard guard(info_.device);
  if (!guard.status().is_ok()) return guard.status();
  return runtime_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize",
                        "device=" + std::to_string(info_.device));
}

Status CudaRuntimeBackend::allocate_host(std::size_t bytes, void** out) {
  const DeviceGuard guard(info_.device);
  if (!guard.status().is_ok()) return guard.status();
  PinMethod method = PinMethod::kHostAlloc;
  try {
    method = pin_method_from_environment();
  } catch (const Error& error) {
    return {error.code(), error.what()};
  }
  return allocate_pinned(bytes, method, out);
}

Status CudaRuntimeBackend::free_host(void* host) { return free_pinned(host); }

Status CudaRuntimeBackend::copy_to_host(void* host, DevicePtr device, std::size_t bytes) {
  const DeviceGuard guard(info_.device);
  if (!guard.status().is_ok()) return guard.status();
  return runtime_status(
      cudaMemcpyAsync(host, reinterpret_cast<const void*>(device), bytes, cudaMemcpyDeviceToHost,
                      nullptr),
      "cudaMemcpyAsync", "device-to-host, bytes=" + std::to_string(bytes));
}

Status CudaRuntimeBackend::copy_to_device(DevicePtr device, const void* host, std::size_t bytes) {
  const DeviceGuard guard(info_.device);
  if (!guard.status().is_ok()) return guard.status();
  return runtime_status(
      cudaMemcpyAsync(reinterpret_cast<void*>(device), host, bytes, cudaMemcpyHostToDevice,
                      nullptr),
      "cudaMemcpyAsync", "host-to-device, bytes=" + std::to_string(bytes));
}

Status CudaRuntimeBackend::malloc_segment(std::size_t bytes, DevicePtr* out) {
  if (bytes == 0) return {ErrorCode::kInvalidArgument, "cudaMalloc: a segment of 0 bytes"};
  const DeviceGuard guard(info_.device);
  if (!guard.status().is_ok()) return guard.status();
  void* ptr = nullptr;
  Status status = check_runtime(cudaMalloc(&ptr, bytes), "cudaMalloc", [&] {
    return "bytes=" + describe_bytes(bytes) + ", device=" + std::to_string(info_.device);
  });
  if (status.is_ok()) *out = reinterpret_cast<DevicePtr>(ptr);
  return status;
}

Status CudaRuntimeBackend::free_malloc_segment(DevicePtr ptr, std::size_t bytes) {
  const DeviceGuard guard(info_.device);
  if (!guard.status().is_ok()) return guard.status();
  // cudaFree waits for all work on the device to finish before it returns: callers must treat
  // it as a device-wide synchronisation (the policy only frees segments on empty_cache / OOM).
  return check_runtime(cudaFree(reinterpret_cast<void*>(ptr)), "cudaFree", [&] {
    return "ptr=" + describe_address(ptr) + ", bytes=" + describe_bytes(bytes);
  });
}

}  // namespace vramledger
