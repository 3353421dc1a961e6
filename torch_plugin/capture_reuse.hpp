// torch's graph_capture_record_stream_reuse (a PYTORCH_CUDA_ALLOC_CONF / _set_allocator_settings
// key): during a CUDA graph capture, a block freed while other streams still use it
// (record_stream) may be reused by its own stream once the capture has joined those streams
// back into it — before the capture ends, which is when such frees complete otherwise.
//
// At the free, the capture position (terminal nodes) of every stream that used the block is
// noted. Before an allocation of the block's stream in the same capture, those notes are looked
// for among the ancestors of the stream's own position: when all of them are there, every use of
// the block on other streams is ordered before whatever the new owner does with it, and the
// block is freed at once (no event: none may be queried during a capture).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <vector>

namespace vramledger::torch_plugin {

class CaptureReuse {
 public:
  // torch's setting, read at each use (it may change at run time).
  static bool enabled();

  // Notes the block at `ptr` of stream `owner` freed now, used on `streams`. False (nothing
  // noted) when a stream is not capturing: nothing can be proven about it, so the free waits
  // for the capture's end.
  bool add(void* ptr, cudaStream_t owner, const std::vector<cudaStream_t>& streams);
  // The noted blocks of `stream` whose uses are all ordered before its current capture position
  // (removed from the notes). Empty when `stream` is not capturing.
  std::vector<void*> take_ordered_before(cudaStream_t stream);
  // Every noted block (the capture ended: they are freed the ordinary way).
  std::vector<void*> take_all();
  // Asked by every allocation: a relaxed read of a count kept beside the notes, no lock (a note
  // added by another thread at this instant is seen by the next allocation).
  bool empty() const { return count_.load(std::memory_order_relaxed) == 0; }

 private:
  struct Pending {
    void* ptr = nullptr;
    cudaStream_t owner = nullptr;  // the block's stream: only its later work may reuse it
    std::vector<cudaGraphNode_t> markers;  // capture positions of the other streams at the free
  };
  void recount_locked() { count_.store(pending_.size(), std::memory_order_relaxed); }

  mutable std::mutex mutex_;
  std::vector<Pending> pending_;
  std::atomic<std::size_t> count_{0};  // pending_.size(), written under mutex_
};

}  // namespace vramledger::torch_plugin
