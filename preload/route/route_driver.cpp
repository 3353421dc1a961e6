#include "preload/route/route_driver.hpp"

namespace vramledger::route {
namespace {

template <typename F>
bool take(vramledger_route_resolve_fn resolve, const char* symbol, F* slot, std::string* missing) {
  *slot = reinterpret_cast<F>(resolve(symbol));
  if (*slot == nullptr && missing->empty()) *missing = symbol;
  return *slot != nullptr;
}

}  // namespace

bool RouteDriver::load(vramledger_route_resolve_fn resolve, std::string* missing) {
  missing->clear();
  bool ok = true;
  ok &= take(resolve, "cuMemAlloc_v2", &mem_alloc, missing);
  ok &= take(resolve, "cuMemFree_v2", &mem_free, missing);
  ok &= take(resolve, "cuMemGetInfo_v2", &mem_get_info, missing);
  ok &= take(resolve, "cuDeviceTotalMem_v2", &device_total_mem, missing);
  ok &= take(resolve, "cuCtxGetCurrent", &ctx_get_current, missing);
  ok &= take(resolve, "cuCtxGetDevice", &ctx_get_device, missing);
  ok &= take(resolve, "cuCtxPushCurrent_v2", &ctx_push_current, missing);
  ok &= take(resolve, "cuCtxPopCurrent_v2", &ctx_pop_current, missing);
  ok &= take(resolve, "cuCtxSynchronize", &ctx_synchronize, missing);
  ok &= take(resolve, "cuDevicePrimaryCtxRetain", &primary_ctx_retain, missing);
  ok &= take(resolve, "cuDevicePrimaryCtxGetState", &primary_ctx_get_state, missing);
  ok &= take(resolve, "cuEventCreate", &event_create, missing);
  ok &= take(resolve, "cuEventDestroy_v2", &event_destroy, missing);
  ok &= take(resolve, "cuEventRecord", &event_record, missing);
  ok &= take(resolve, "cuEventQuery", &event_query, missing);
  ok &= take(resolve, "cuEventSynchronize", &event_synchronize, missing);
  ok &= take(resolve, "cuStreamWaitEvent", &stream_wait_event, missing);
  return ok;
}

}  // namespace vramledger::route
