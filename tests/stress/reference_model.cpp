#include "tests/stress/reference_model.hpp"

#include <algorithm>
#include <iterator>

#include "allocator/text_format.hpp"
#include "tests/stress/concat.hpp"

namespace vramledger::stress {

namespace {
std::string describe_block(DevicePtr address, const LiveBlock& block) {
  return concat("[", format_hex(address), ", ", format_hex(address + block.size), ") requested ",
                block.requested, " on stream ", format_hex(block.stream));
}
}  // namespace

std::optional<std::string> ReferenceModel::insert(DevicePtr address, const LiveBlock& block) {
  if (block.size == 0 || block.size < block.requested) {
    return concat("block ", describe_block(address, block), " is smaller than requested");
  }
  auto after = blocks_.lower_bound(address);
  if (after != blocks_.end() && after->first < address + block.size) {
    return concat("new block ", describe_block(address, block), " overlaps live block ",
                  describe_block(after->first, after->second));
  }
  if (after != blocks_.begin()) {
    auto before = std::prev(after);
    if (before->first + before->second.size > address) {
      return concat("new block ", describe_block(address, block), " overlaps live block ",
                    describe_block(before->first, before->second));
    }
  }
  blocks_.emplace_hint(after, address, block);
  allocated_bytes_ += block.size;
  return std::nullopt;
}

bool ReferenceModel::erase(DevicePtr address) {
  auto it = blocks_.find(address);
  if (it == blocks_.end()) return false;
  allocated_bytes_ -= it->second.size;
  blocks_.erase(it);
  return true;
}

DevicePtr ReferenceModel::nth(std::size_t index) const {
  return std::next(blocks_.begin(), static_cast<std::ptrdiff_t>(index))->first;
}

std::optional<std::string> ReferenceModel::compare_with(
    const std::vector<SegmentInfo>& segments) const {
  std::map<DevicePtr, const BlockInfo*> allocated;
  std::vector<std::pair<DevicePtr, DevicePtr>> ranges;
  for (const SegmentInfo& segment : segments) {
    ranges.emplace_back(segment.address, segment.address + segment.size);
    DevicePtr cursor = segment.address;
    for (const BlockInfo& info : segment.blocks) {
      if (info.address != cursor) {
        return concat("blocks of range ", format_hex(segment.address), " do not tile it: gap or overlap at ",
                      format_hex(cursor), " (next block starts at ", format_hex(info.address), ")");
      }
      cursor += info.size;
      if (info.allocated) allocated.emplace(info.address, &info);
    }
    if (cursor != segment.address + segment.size) {
      return concat("blocks of range ", format_hex(segment.address), " end at ", format_hex(cursor),
                    ", not at the range's end ", format_hex(segment.address + segment.size));
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      return concat("ranges at ", format_hex(ranges[i - 1].first), " and ", format_hex(ranges[i].first),
                    " overlap");
    }
  }
  if (allocated.size() != blocks_.size()) {
    return concat("the allocator holds ", allocated.size(), " allocated blocks, the model ",
                  blocks_.size());
  }
  for (const auto& [address, block] : blocks_) {
    auto it = allocated.find(address);
    if (it == allocated.end()) {
      return concat("model block ", describe_block(address, block),
                    " is not allocated in the allocator");
    }
    const BlockInfo& info = *it->second;
    if (info.size != block.size || info.requested != block.requested || info.tag != block.tag) {
      return concat("block ", format_hex(address), ": allocator says size ", info.size, " requested ",
                    info.requested, " tag ", info.tag, ", model ", block.size, " / ",
                    block.requested, " / ", block.tag);
    }
  }
  return std::nullopt;
}

}  // namespace vramledger::stress
