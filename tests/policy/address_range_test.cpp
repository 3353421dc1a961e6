// A span's page bitmap (allocator/detail/address_range.hpp): counting mapped pages, which the
// paged heap does on every allocation and free of a span block, without a library call.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <random>

#include "allocator/detail/address_range.hpp"

namespace vramledger {
namespace {

TEST(AddressRange, BitsSetEqualsPopcount) {
  for (const std::uint64_t bits : {std::uint64_t{0}, ~std::uint64_t{0}, std::uint64_t{1},
                                   std::uint64_t{1} << 63, std::uint64_t{0x8000000000000001},
                                   std::uint64_t{0x5555555555555555}, std::uint64_t{0xff00ff00ff00ff00}}) {
    EXPECT_EQ(bits_set(bits), static_cast<std::size_t>(std::popcount(bits))) << std::hex << bits;
  }
  std::mt19937_64 rng(17);
  for (int i = 0; i < 100'000; ++i) {
    const std::uint64_t bits = rng() & rng();  // sparser words too
    ASSERT_EQ(bits_set(bits), static_cast<std::size_t>(std::popcount(bits))) << std::hex << bits;
  }
}

// Any range, one page or many words, wholly or partly past the bitmap: the count a page-by-page
// look gives.
TEST(AddressRange, CountMappedEqualsLookingAtEachPage) {
  std::mt19937_64 rng(23);
  AddressRange range;
  range.mapped_bits.resize(5);
  for (std::uint64_t& word : range.mapped_bits) word = rng();
  range.mapped_bits[2] = ~std::uint64_t{0};
  range.mapped_bits[3] = 0;
  const std::size_t known = range.mapped_bits.size() * 64;
  for (int i = 0; i < 20'000; ++i) {
    const std::size_t first = rng() % (known + 70);
    const std::size_t last = first + 1 + (i % 3 == 0 ? 0 : rng() % 200);
    std::size_t expected = 0;
    for (std::size_t page = first; page < last; ++page) expected += range.is_mapped(page) ? 1 : 0;
    ASSERT_EQ(range.count_mapped(first, last), expected) << "[" << first << ", " << last << ")";
  }
}

}  // namespace
}  // namespace vramledger
