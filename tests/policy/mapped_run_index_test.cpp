// The index of free span blocks' mapped runs by length (allocator/detail/mapped_run_index.hpp):
// it must choose what a walk over every fit chooses — the tightest run, ties to the first in
// FreeBlockIndex::for_each_fit's order (bins ascending, newest block first, runs in address
// order) — while blocks come and go and the span's pages are mapped and unmapped.
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "allocator/detail/address_range.hpp"
#include "allocator/detail/free_block_index.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kPage = 2 << 20;

struct Choice {
  Block* block = nullptr;
  DevicePtr from = 0;
  bool operator==(const Choice&) const = default;
};

// The definition: every fit walked in order, each one's pages scanned.
std::optional<Choice> walk(const FreeBlockIndex& index, std::size_t size) {
  std::optional<Choice> best;
  std::size_t best_bytes = std::numeric_limits<std::size_t>::max();
  index.for_each_fit(size, std::numeric_limits<int>::max(), [&](Block* block) {
    const AddressRange& span = *block->range;
    for (DevicePtr page = (block->address - span.base) / kPage * kPage + span.base;
         page < block->end();) {
      if (!span.is_mapped((page - span.base) / kPage)) {
        page += kPage;
        continue;
      }
      DevicePtr end = page;
      while (end < block->end() && span.is_mapped((end - span.base) / kPage)) end += kPage;
      const DevicePtr from = std::max(page, block->address);
      const std::size_t bytes = std::min(end, block->end()) - from;
      if (bytes >= size && bytes < best_bytes) {
        best_bytes = bytes;
        best = Choice{block, from};
      }
      page = end;
    }
  });
  return best;
}

std::optional<Choice> indexed(FreeBlockIndex& index, std::size_t size) {
  const MappedRun* run = index.mapped_runs().tightest(size);
  if (run == nullptr) return std::nullopt;
  return Choice{run->block, run->from};
}

// A span of `pages` pages tiled by blocks, the free ones in an index that tracks their runs.
struct Rig {
  explicit Rig(std::size_t pages) {
    span.base = 0x7000'0000'0000;
    span.size = pages * kPage;
    span.is_span = true;
    span.grow_pages(pages);
    index.track_mapped_runs(kPage);
    span.run_index = &index.mapped_runs();
  }
  Block* add(DevicePtr offset, std::size_t size, bool free = true) {
    blocks.push_back(std::make_unique<Block>());
    Block* block = blocks.back().get();
    block->address = span.base + offset;
    block->size = size;
    block->range = &span;
    block->state = free ? BlockState::kFree : BlockState::kAllocated;
    if (free) index.insert(block);
    return block;
  }
  void map(std::size_t first, std::size_t pages) {
    span.set_chunk_mapped(first, PhysicalChunk{next_handle++, pages});
  }
  AddressRange span;
  FreeBlockIndex index;
  std::vector<std::unique_ptr<Block>> blocks;
  PhysicalHandle next_handle = 1;
};

TEST(MappedRunIndex, RunsAreClippedToTheirBlock) {
  Rig rig(16);
  rig.map(0, 8);
  // A free block from half-way into page 1 to half-way into page 5: one run, clipped both sides.
  Block* block = rig.add(kPage + kPage / 2, 4 * kPage);
  ASSERT_EQ(indexed(rig.index, kPage), (Choice{block, block->address}));
  EXPECT_EQ(rig.index.mapped_runs().tightest(kPage)->bytes, 4 * kPage);
  EXPECT_EQ(indexed(rig.index, 4 * kPage + 1), std::nullopt);
}

TEST(MappedRunIndex, TiesGoToTheLowerBinThenTheNewestBlockThenTheLowerAddress) {
  Rig rig(64);
  // Two runs of 4 pages: one fills a 4-page block, the other half of an 8-page block, inserted
  // later. The smaller block's bin comes first in the walk.
  rig.map(0, 4);
  Block* four = rig.add(0, 4 * kPage);
  rig.add(4 * kPage, kPage, /*free=*/false);
  rig.map(5, 4);
  Block* eight = rig.add(5 * kPage, 8 * kPage);
  EXPECT_EQ(indexed(rig.index, 3 * kPage), (Choice{four, four->address}));
  // Another 4-page block in the same bin as the first, newer: it comes first.
  rig.add(13 * kPage, kPage, /*free=*/false);
  rig.map(14, 4);
  Block* newer = rig.add(14 * kPage, 4 * kPage);
  EXPECT_EQ(indexed(rig.index, 3 * kPage), (Choice{newer, newer->address}));
  rig.index.remove(four);
  rig.index.insert(four);  // now the newest
  EXPECT_EQ(indexed(rig.index, 3 * kPage), (Choice{four, four->address}));
  // One block with two runs of 2 pages: the lower address.
  rig.add(19 * kPage, kPage, /*free=*/false);
  rig.map(20, 2);
  rig.map(23, 2);
  Block* two_runs = rig.add(20 * kPage, 5 * kPage);
  EXPECT_EQ(indexed(rig.index, 2 * kPage), (Choice{two_runs, two_runs->address}));
  // An exact fit beats every longer run, wherever it is.
  EXPECT_EQ(indexed(rig.index, 4 * kPage), (Choice{four, four->address}));
  rig.index.remove(four);
  rig.index.remove(newer);
  EXPECT_EQ(indexed(rig.index, 4 * kPage), (Choice{eight, eight->address}));
  for (std::size_t size : {kPage / 2, kPage, 2 * kPage, 3 * kPage, 4 * kPage, 5 * kPage}) {
    EXPECT_EQ(indexed(rig.index, size), walk(rig.index, size)) << size;
  }
}

TEST(MappedRunIndex, FollowsMapsAndUnmapsOfAFreeBlocksPages) {
  Rig rig(32);
  Block* block = rig.add(0, 32 * kPage);
  EXPECT_EQ(indexed(rig.index, kPage), std::nullopt);
  rig.map(3, 4);
  EXPECT_EQ(indexed(rig.index, kPage), (Choice{block, block->address + 3 * kPage}));
  rig.map(10, 1);
  EXPECT_EQ(indexed(rig.index, kPage), (Choice{block, block->address + 10 * kPage}));
  rig.span.clear_chunk_mapped(10);
  EXPECT_EQ(indexed(rig.index, kPage), (Choice{block, block->address + 3 * kPage}));
  rig.index.remove(block);
  EXPECT_EQ(indexed(rig.index, kPage), std::nullopt);
}

// Random tilings, sizes, inserts, removes, maps and unmaps: the index and the walk agree at
// every query.
TEST(MappedRunIndex, ChoosesWhatTheWalkChooses) {
  std::mt19937_64 rng(41);
  for (int round = 0; round < 40; ++round) {
    constexpr std::size_t kPages = 96;
    Rig rig(kPages);
    // Tile the span with blocks of 1/4 page to 9 pages, about half of them free.
    std::vector<Block*> free_blocks;
    std::vector<Block*> out;  // free but out of the index for now
    for (DevicePtr offset = 0; offset < kPages * kPage;) {
      const std::size_t size =
          std::min<std::size_t>(kPages * kPage - offset, (1 + rng() % 36) * kPage / 4);
      Block* block = rig.add(offset, size, rng() % 2 == 0);
      if (block->state == BlockState::kFree) free_blocks.push_back(block);
      offset += size;
    }
    std::vector<std::size_t> heads;
    for (int step = 0; step < 400; ++step) {
      switch (rng() % 4) {
        case 0: {  // map a chunk of 1-4 unmapped pages
          const std::size_t first = rng() % kPages;
          std::size_t pages = 0;
          while (pages < 1 + rng() % 4 && first + pages < kPages &&
                 !rig.span.is_mapped(first + pages)) {
            ++pages;
          }
          if (pages > 0) {
            rig.map(first, pages);
            heads.push_back(first);
          }
          break;
        }
        case 1:  // unmap a chunk
          if (!heads.empty()) {
            const std::size_t k = rng() % heads.size();
            rig.span.clear_chunk_mapped(heads[k]);
            heads.erase(heads.begin() + static_cast<std::ptrdiff_t>(k));
          }
          break;
        case 2:  // a free block leaves the index, or comes back (newest now)
          if (!free_blocks.empty() && rng() % 2 == 0) {
            const std::size_t k = rng() % free_blocks.size();
            rig.index.remove(free_blocks[k]);
            out.push_back(free_blocks[k]);
            free_blocks.erase(free_blocks.begin() + static_cast<std::ptrdiff_t>(k));
          } else if (!out.empty()) {
            const std::size_t k = rng() % out.size();
            rig.index.insert(out[k]);
            free_blocks.push_back(out[k]);
            out.erase(out.begin() + static_cast<std::ptrdiff_t>(k));
          }
          break;
        default: {
          const std::size_t size = 1 + rng() % (6 * kPage);
          ASSERT_EQ(indexed(rig.index, size), walk(rig.index, size))
              << "round " << round << " step " << step << " size " << size;
        }
      }
    }
  }
}

}  // namespace
}  // namespace vramledger
