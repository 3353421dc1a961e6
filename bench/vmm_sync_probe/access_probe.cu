// Which CUDA runtime calls accept, at enqueue time, an address that is not mapped yet, or mapped
// without access granted? map_in_background (docs/design.md 3.1) queued the map for a helper and
// made the stream wait on the GPU; under torch, ViT training then failed with "invalid argument"
// in its backward pass (2026-12-03): the runtime validates the pointers of memset and memcpy when
// they are queued, not when they run. If a mapped address without access passes that validation,
// the cheap cuMemMap (~1 us) can stay on the allocating thread and only cuMemSetAccess (~27 us a
// page, the expensive part) go to the helper.
//
// Build: nvcc -O2 -std=c++17 -o access_probe access_probe.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {
void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    const char* s = nullptr;
    cuGetErrorString(r, &s);
    std::printf("%s failed: %s\n", what, s ? s : "?");
    std::exit(1);
  }
}
const char* name(cudaError_t e) { return cudaGetErrorName(e); }
}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  cudaSetDevice(0);
  cudaFree(nullptr);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const size_t page = 4u << 20;
  void* src = nullptr;
  cudaMalloc(&src, page);
  cudaMemset(src, 7, page);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  unsigned* counter = nullptr;
  check(cuMemHostAlloc(reinterpret_cast<void**>(&counter), 4, CU_MEMHOSTALLOC_DEVICEMAP), "host alloc");
  *counter = 0;
  unsigned ticket = 0;
  // 1 first: mapped, no access. 0: not mapped at enqueue (a run of 2026-12-03 hung there: an
  // unknown address counts as pageable host memory for cudaMemcpyDefault, staged synchronously
  // behind the wait), so it skips that copy.
  for (int mode : {1, 0}) {
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle handle = 0;
    check(cuMemAddressReserve(&va, page, page, 0, 0), "reserve");
    check(cuMemCreate(&handle, page, &prop, 0), "create");
    if (mode == 1) check(cuMemMap(va, page, 0, handle, 0), "map");
    ++ticket;
    check(cuStreamWaitValue32(stream, reinterpret_cast<CUdeviceptr>(counter), ticket, CU_STREAM_WAIT_VALUE_GEQ), "wait");
    void* p = reinterpret_cast<void*>(va);
    const cudaError_t memset_r = cudaMemsetAsync(p, 1, page, stream);
    (void)cudaGetLastError();
    const cudaError_t copy_d2d = cudaMemcpyAsync(p, src, page, cudaMemcpyDeviceToDevice, stream);
    (void)cudaGetLastError();
    const cudaError_t copy_default =
        mode == 1 ? cudaMemcpyAsync(p, src, page, cudaMemcpyDefault, stream) : cudaErrorNotYetImplemented;
    (void)cudaGetLastError();
    cudaPointerAttributes attrs{};
    const cudaError_t attr_r = cudaPointerGetAttributes(&attrs, p);
    (void)cudaGetLastError();
    std::printf("%s at enqueue: cudaMemsetAsync %s, cudaMemcpyAsync D2D %s, cudaMemcpyAsync default %s, "
                "cudaPointerGetAttributes %s (type %d)\n",
                mode == 0 ? "not mapped" : "mapped without access", name(memset_r), name(copy_d2d),
                name(copy_default), name(attr_r), static_cast<int>(attrs.type));
    // Now what a helper would do, then the raise.
    if (mode == 0) check(cuMemMap(va, page, 0, handle, 0), "map");
    check(cuMemSetAccess(va, page, &access, 1), "access");
    __atomic_store_n(counter, ticket, __ATOMIC_RELEASE);
    const cudaError_t sync = cudaStreamSynchronize(stream);
    std::vector<unsigned char> back(page);
    cudaMemcpy(back.data(), p, page, cudaMemcpyDeviceToHost);
    long wrong = 0;
    for (unsigned char b : back) wrong += b != 7;
    std::printf("  after the raise: stream %s, bytes not 7: %ld\n", name(sync), wrong);
    (void)cudaGetLastError();
    cuMemUnmap(va, page);
    cuMemRelease(handle);
    cuMemAddressFree(va, page);
  }
  // Costs: map alone and access alone, 4 MiB, median of 50.
  {
    std::vector<double> map_us, access_us, unmap_us;
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle handle = 0;
    check(cuMemAddressReserve(&va, page, page, 0, 0), "reserve");
    check(cuMemCreate(&handle, page, &prop, 0), "create");
    for (int i = 0; i < 50; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      check(cuMemMap(va, page, 0, handle, 0), "map");
      auto t1 = std::chrono::steady_clock::now();
      check(cuMemSetAccess(va, page, &access, 1), "access");
      auto t2 = std::chrono::steady_clock::now();
      check(cuMemUnmap(va, page), "unmap");
      auto t3 = std::chrono::steady_clock::now();
      map_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      access_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
      unmap_us.push_back(std::chrono::duration<double, std::micro>(t3 - t2).count());
    }
    auto median = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
    std::printf("4 MiB, median of 50: cuMemMap %.1f us, cuMemSetAccess %.1f us, cuMemUnmap %.1f us\n",
                median(map_us), median(access_us), median(unmap_us));
  }
  std::printf("done\n");
  return 0;
}
