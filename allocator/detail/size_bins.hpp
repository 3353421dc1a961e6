// Two-level segregated size bins (TLSF): sizes are grouped by power of two and each power is cut
// into 32 equal classes, so every size in a bin is within ~3% of the bin's minimum, and bins are
// in size order (every size of bin b is smaller than every size of bin b + 1). Shared by the
// free-block index and the index of mapped runs, which bin blocks and runs alike.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace vramledger::size_bins {

inline constexpr int kSubclassBits = 5;
inline constexpr int kSubclasses = 1 << kSubclassBits;
inline constexpr int kClasses = 64 - kSubclassBits + 1;
inline constexpr std::size_t kBins = static_cast<std::size_t>(kClasses) * kSubclasses;

inline std::uint32_t bin_of(std::size_t size) {
  if (size < kSubclasses) return static_cast<std::uint32_t>(size);
  const int msb = std::bit_width(size) - 1;
  const int cls = msb - kSubclassBits + 1;
  const auto sub = static_cast<std::uint32_t>((size >> (msb - kSubclassBits)) - kSubclasses);
  return (static_cast<std::uint32_t>(cls) << kSubclassBits) | sub;
}

inline int class_of(std::uint32_t bin) { return static_cast<int>(bin >> kSubclassBits); }

// Which bins hold something, as one bit per class and one per bin of each class: the first
// non-empty bin above a given one is two bit scans away.
class BinBitmap {
 public:
  void set(std::uint32_t bin) {
    const int cls = class_of(bin);
    subclasses_[cls] |= 1u << (bin & (kSubclasses - 1));
    classes_ |= std::uint64_t{1} << cls;
  }
  void clear(std::uint32_t bin) {
    const int cls = class_of(bin);
    subclasses_[cls] &= ~(1u << (bin & (kSubclasses - 1)));
    if (subclasses_[cls] == 0) classes_ &= ~(std::uint64_t{1} << cls);
  }
  // The first non-empty bin at or above `bin`, or kBins.
  std::uint32_t first_at_or_above(std::uint32_t bin) const {
    if (bin >= kBins) return kBins;
    int cls = class_of(bin);
    std::uint32_t subs = subclasses_[cls] & (~0u << (bin & (kSubclasses - 1)));
    if (subs == 0) {
      const std::uint64_t higher =
          cls + 1 < 64 ? classes_ & (~std::uint64_t{0} << (cls + 1)) : 0;
      if (higher == 0) return kBins;
      cls = std::countr_zero(higher);
      subs = subclasses_[cls];
    }
    return (static_cast<std::uint32_t>(cls) << kSubclassBits) |
           static_cast<std::uint32_t>(std::countr_zero(subs));
  }
  std::uint64_t classes() const { return classes_; }
  std::uint32_t subclasses(int cls) const { return subclasses_[cls]; }

 private:
  std::uint64_t classes_ = 0;
  std::uint32_t subclasses_[kClasses] = {};
};

}  // namespace vramledger::size_bins
