#include "torch_plugin/graph_pools.hpp"

#include <algorithm>
#include <cstdint>

#include "torch_plugin/device_allocators.hpp"
#include "torch_plugin/json_writer.hpp"

namespace vramledger::torch_plugin {

std::string graph_pools_json(DeviceAllocators& device) {
  std::string out;
  {
    JsonWriter pools(out, '[');
    device.for_each_pool(
        {0, 0},
        [&](MemoryPool& pool) {
          if (!pool.is_private()) return;
          const BlockCensus census = pool.policy().census();
          BlockCensus::PerPool sum;
          std::int64_t largest = 0;
          std::int64_t fragmentation = 0;
          for (const BlockCensus::PerPool& kind : census.pools) {
            sum.allocation += kind.allocation;
            sum.allocated_bytes += kind.allocated_bytes;
            sum.requested_bytes += kind.requested_bytes;
            sum.segment += kind.segment;
            sum.reserved_bytes += kind.reserved_bytes;
            sum.free_bytes += kind.free_bytes;
            largest = std::max(largest, kind.largest_free_block);
            fragmentation += kind.free_bytes - kind.largest_free_block;
          }
          std::string& item = pools.item();
          JsonWriter object(item);
          // Appended piece by piece (GCC 12's -Wrestrict misfires on one long concatenation).
          std::string& id = object.key("id");
          id += '[';
          id += std::to_string(pool.id().first);
          id += ',';
          id += std::to_string(pool.id().second);
          id += ']';
          object.number("use_count", pool.use_count);
          object.number("segments", sum.segment);
          object.number("blocks", sum.allocation);
          object.number("reserved_bytes", sum.reserved_bytes);
          object.number("live_bytes", sum.allocated_bytes);
          object.number("requested_bytes", sum.requested_bytes);
          object.number("cached_bytes", sum.free_bytes);
          object.number("largest_free_bytes", largest);
          object.number("fragmentation_bytes", fragmentation);
          // docs/sleep.md: graph pools sleep under the name "graphs"; asleep, reserved is 0
          // and the live blocks' bytes are sleeping_bytes.
          std::int64_t sleeping = 0;
          for (const BlockCensus::PerPool& kind : census.pools) sleeping += kind.sleeping_bytes;
          object.boolean("sleepable", pool.sleepable());
          object.boolean("asleep", pool.policy().pool_asleep());
          object.number("sleeping_bytes", sleeping);
        },
        /*all_pools=*/true);
  }
  return out;
}

}  // namespace vramledger::torch_plugin
