#include "allocator/config.hpp"

#include <array>
#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <system_error>

#include "allocator/errors.hpp"

namespace vramledger {

namespace {

constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max();
constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;
constexpr std::size_t kTiB = std::size_t{1} << 40;

// Bounds on what a setting can mean on a device. The largest GPU memory today is under 300 GB
// (H200 141 GB, B200 192 GB, B300 288 GB); 4 TiB leaves room for a decade and keeps sums of a
// few settings far from overflowing 64 bits inside the policy.
constexpr std::size_t kLargestDeviceBytes = 4 * kTiB;
// A rounding beyond 1 GiB makes every request hold at least that much; 2^43 mapped the whole
// device per request and 2^62 made the paged heap loop forever (issue 16).
constexpr std::size_t kLargestRoundBytes = kGiB;
// Pages are the device granularity (2 MiB) or a small multiple of it.
constexpr std::size_t kLargestPageBytes = kGiB;
// Spans default to twice the device memory.
constexpr std::size_t kLargestSpanBytes = 2 * kLargestDeviceBytes;
// The policy reads the slack as thousandths above a peak; beyond 100x it means "never take".
constexpr std::size_t kLargestSlackPermille = 100000;
// A stream's idle page that 2^40 of its allocations have not needed is cold by any measure.
constexpr std::size_t kLargestColdAllocations = std::size_t{1} << 40;
constexpr std::size_t kLargestColdStreams = std::size_t{1} << 20;
// CachingAllocator::Impl::kMaxLanes.
constexpr std::size_t kLargestStreamLanes = 32;

constexpr std::array<std::string_view, 5> kBackends = {"auto", "simulated", "cuda_malloc", "vmm",
                                                       "malloc_async"};

enum class ValueKind { kBackend, kSize, kBool };

// How a size key maps to a field of AllocatorOptions, and which values make sense.
struct SizeRule {
  std::size_t AllocatorOptions::*field = nullptr;
  std::size_t unit = 1;
  const char* unit_name = "bytes";
  const char* zero_is_invalid_because = nullptr;  // null: 0 is meaningful
  bool accepts_unlimited = false;
  bool must_be_power_of_two = false;
  std::size_t max_bytes = kLargestDeviceBytes;  // the largest meaningful value, in bytes
  const char* max_reason = "more memory than any device has";
};

struct KeySpec {
  std::string_view name;
  std::string_view setting;  // keys setting the same thing share it (cap_mb, cap_gb)
  ValueKind kind;
  SizeRule size;
  bool AllocatorOptions::*flag = nullptr;  // kBool keys
};

const std::array<KeySpec, 25>& key_table() {
  static const std::array<KeySpec, 25> table = {{
      {"backend", "backend", ValueKind::kBackend, {}},
      {"round_bytes",
       "round_bytes",
       ValueKind::kSize,
       {&AllocatorOptions::round_bytes, 1, "bytes", "requests cannot be rounded to 0", false,
        true, kLargestRoundBytes, "every request would be rounded up to more than 1 GiB"}},
      {"small_size_limit_kb",
       "small_size_limit_kb",
       ValueKind::kSize,
       {&AllocatorOptions::small_size_limit, kKiB, "KiB", nullptr, false, false}},
      {"small_segment_mb",
       "small_segment_mb",
       ValueKind::kSize,
       {&AllocatorOptions::small_segment_bytes, kMiB, "MiB", "a segment cannot be empty", false,
        false}},
      {"large_segment_mb",
       "large_segment_mb",
       ValueKind::kSize,
       {&AllocatorOptions::large_segment_bytes, kMiB, "MiB", "a segment cannot be empty", false,
        false}},
      {"max_split_mb",
       "max_split_mb",
       ValueKind::kSize,
       {&AllocatorOptions::max_split_bytes, kMiB, "MiB", nullptr, false, false}},
      {"page_mb",
       "page_mb",
       ValueKind::kSize,
       {&AllocatorOptions::page_bytes, kMiB, "MiB", nullptr, false, false, kLargestPageBytes,
        "pages are the device granularity (2 MiB) or a small multiple of it"}},
      {"span_gb",
       "span_gb",
       ValueKind::kSize,
       {&AllocatorOptions::span_bytes, kGiB, "GiB", nullptr, false, false, kLargestSpanBytes,
        "a span beyond twice the largest device memory reserves address space for nothing"}},
      {"max_free_mapped_mb",
       "max_free_mapped_mb",
       ValueKind::kSize,
       {&AllocatorOptions::max_free_mapped_bytes, kMiB, "MiB", nullptr, true, false}},
      {"max_free_physical_mb",
       "max_free_physical_mb",
       ValueKind::kSize,
       {&AllocatorOptions::max_free_physical_bytes, kMiB, "MiB", nullptr, true, false}},
      {"map_chunk_mb",
       "map_chunk_mb",
       ValueKind::kSize,
       {&AllocatorOptions::map_chunk_bytes, kMiB, "MiB", "a chunk holds at least one page",
        false, false}},
      {"cross_stream_slack_pct",
       "cross_stream_slack",
       ValueKind::kSize,
       {&AllocatorOptions::cross_stream_slack_permille, 10, "percent", nullptr, false, false,
        kLargestSlackPermille, "beyond 100-fold the peak, growth is never limited anyway"}},
      {"cross_stream_slack_permille",
       "cross_stream_slack",
       ValueKind::kSize,
       {&AllocatorOptions::cross_stream_slack_permille, 1, "per mille", nullptr, false, false,
        kLargestSlackPermille, "beyond 100-fold the peak, growth is never limited anyway"}},
      {"cross_stream_cold_allocs",
       "cross_stream_cold_allocs",
       ValueKind::kSize,
       {&AllocatorOptions::cross_stream_cold_allocations, 1, "allocations", nullptr, false,
        false, kLargestColdAllocations, "no stream makes that many allocations"}},
      {"cross_stream_cold_streams",
       "cross_stream_cold_streams",
       ValueKind::kSize,
       {&AllocatorOptions::cross_stream_cold_streams, 1, "streams", nullptr, false, false,
        kLargestColdStreams, "no process allocates on that many streams at once"}},
      {"stream_lanes",
       "stream_lanes",
       ValueKind::kSize,
       {&AllocatorOptions::stream_lanes, 1, "lanes", "a stream has at least its own heaps (1)",
        false, false, kLargestStreamLanes, "a stream has at most 32 lanes"}},
      {"cap_mb",
       "cap",
       ValueKind::kSize,
       {&AllocatorOptions::cap_bytes, kMiB, "MiB", nullptr, false, false}},
      {"cap_gb",
       "cap",
       ValueKind::kSize,
       {&AllocatorOptions::cap_bytes, kGiB, "GiB", nullptr, false, false}},
      {"paged_heap", "paged_heap", ValueKind::kBool, {}, &AllocatorOptions::use_paged_heap},
      {"alias_pending_pages", "alias_pending_pages", ValueKind::kBool, {},
       &AllocatorOptions::alias_pending_pages},
      {"unmap_in_background", "unmap_in_background", ValueKind::kBool, {},
       &AllocatorOptions::unmap_in_background},
      {"adopt_pending_frees", "adopt_pending_frees", ValueKind::kBool, {},
       &AllocatorOptions::adopt_pending_frees},
      {"place_by_mapped_pages", "place_by_mapped_pages", ValueKind::kBool, {},
       &AllocatorOptions::place_by_mapped_pages},
      {"sleepable_graph_pools", "sleepable_graph_pools", ValueKind::kBool, {},
       &AllocatorOptions::sleepable_graph_pools},
      {"front_cache_mb",
       "front_cache_mb",
       ValueKind::kSize,
       {&AllocatorOptions::front_cache_bytes, kMiB, "MiB", nullptr, false, false}},
  }};
  return table;
}

const KeySpec* find_key(std::string_view name) {
  for (const KeySpec& spec : key_table()) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

std::string known_keys() {
  std::string names;
  for (const KeySpec& spec : key_table()) {
    if (!names.empty()) names += ", ";
    names += spec.name;
  }
  return names;
}

[[noreturn]] void fail(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, "allocator config: " + message);
}

[[noreturn]] void fail_value(std::string_view key, std::string_view value, const std::string& why) {
  fail("key '" + std::string(key) + "' has invalid value '" + std::string(value) + "': " + why);
}

std::string_view trim(std::string_view text) {
  constexpr std::string_view kSpace = " \t\n\r\v\f";
  const std::size_t first = text.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  const std::size_t last = text.find_last_not_of(kSpace);
  return text.substr(first, last - first + 1);
}

bool is_digits(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) {
      return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

// Why `units` of this key make no sense, or nothing when they do. Shared by parse and print so
// that whatever to_string writes, parse_config accepts.
std::optional<std::string> rule_violation(const SizeRule& rule, std::uint64_t units) {
  if (units == 0 && rule.zero_is_invalid_because != nullptr) {
    return std::string("0 is not allowed: ") + rule.zero_is_invalid_because;
  }
  if (rule.must_be_power_of_two && (units & (units - 1)) != 0) {
    return std::string("must be a power of two");
  }
  if (units > kUnlimited / rule.unit) {
    return std::to_string(units) + " " + rule.unit_name + " do not fit in a 64-bit byte count";
  }
  if (units * rule.unit > rule.max_bytes) {
    return "at most " + std::to_string(rule.max_bytes / rule.unit) + " " + rule.unit_name +
           " (" + rule.max_reason + ")";
  }
  return std::nullopt;
}

std::size_t parse_size(const KeySpec& spec, std::string_view value) {
  const SizeRule& rule = spec.size;
  if (rule.accepts_unlimited && value == "unlimited") return kUnlimited;

  if (value.front() == '-' && is_digits(value.substr(1))) {
    fail_value(spec.name, value, "must not be negative");
  }
  if (!is_digits(value)) {
    fail_value(spec.name, value,
               std::string("expected a whole number of ") + rule.unit_name +
                   (rule.accepts_unlimited ? " or 'unlimited'" : ""));
  }
  std::uint64_t units = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), units);
  if (error == std::errc::result_out_of_range) {
    fail_value(spec.name, value, "too large for a 64-bit number");
  }
  if (error != std::errc() || end != value.data() + value.size()) {
    fail_value(spec.name, value, "not a number");  // unreachable after is_digits; kept for safety
  }
  if (auto why = rule_violation(rule, units)) fail_value(spec.name, value, *why);
  return static_cast<std::size_t>(units) * rule.unit;
}

void apply(const KeySpec& spec, std::string_view value, Config& config) {
  switch (spec.kind) {
    case ValueKind::kBackend:
      for (std::string_view backend : kBackends) {
        if (value == backend) {
          config.backend = std::string(backend);
          return;
        }
      }
      fail_value(spec.name, value, "expected auto, simulated, cuda_malloc, vmm or malloc_async");
    case ValueKind::kBool:
      if (equals_ignoring_case(value, "true")) {
        config.options.*(spec.flag) = true;
      } else if (equals_ignoring_case(value, "false")) {
        config.options.*(spec.flag) = false;
      } else {
        fail_value(spec.name, value, "expected true or false");
      }
      return;
    case ValueKind::kSize: config.options.*(spec.size.field) = parse_size(spec, value); return;
  }
}

// Rules that tie two keys together; the message names both keys and their values.
void check_combination(const Config& config) {
  const AllocatorOptions& options = config.options;
  if (options.small_size_limit > options.small_segment_bytes) {
    fail("small_size_limit_kb " + std::to_string(options.small_size_limit / kKiB) +
         " KiB exceeds small_segment_mb " + std::to_string(options.small_segment_bytes / kMiB) +
         " MiB: every small request must fit in a small segment");
  }
}

}  // namespace

Config parse_config(std::string_view text) {
  Config config;
  if (trim(text).empty()) return config;

  std::set<std::string_view> settings_given;
  std::set<std::string_view> keys_given;
  std::size_t entry_start = 0;
  while (entry_start <= text.size()) {
    std::size_t comma = text.find(',', entry_start);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view entry = trim(text.substr(entry_start, comma - entry_start));
    entry_start = comma + 1;

    if (entry.empty()) {
      fail("empty entry at offset " + std::to_string(comma) + " of '" + std::string(text) +
           "' (a stray comma?)");
    }
    const std::size_t colon = entry.find(':');
    const std::string_view key = trim(entry.substr(0, colon));
    if (key.empty()) fail("entry '" + std::string(entry) + "' has no key before ':'");
    const KeySpec* spec = find_key(key);
    if (spec == nullptr) {
      fail("unknown key '" + std::string(key) + "' (known keys: " + known_keys() + ")");
    }
    const std::string_view value =
        colon == std::string_view::npos ? std::string_view{} : trim(entry.substr(colon + 1));
    if (value.empty()) {
      fail("key '" + std::string(key) + "' has no value (write " + std::string(key) + ":VALUE)");
    }
    if (!settings_given.insert(spec->setting).second) {
      if (keys_given.contains(spec->name)) {
        fail("key '" + std::string(key) + "' is given twice (again with value '" +
             std::string(value) + "')");
      }
      std::string spellings;
      for (const KeySpec& other : key_table()) {
        if (other.setting != spec->setting) continue;
        spellings += spellings.empty() ? "" : " and ";
        spellings += other.name;
      }
      fail("key '" + std::string(key) + "' (value '" + std::string(value) +
           "') sets what another key already set; give only one of " + spellings);
    }
    keys_given.insert(spec->name);
    apply(*spec, value, config);
  }
  check_combination(config);
  return config;
}

std::string to_string(const Config& config) {
  const AllocatorOptions& options = config.options;
  if (options.round_large_segment_bytes != AllocatorOptions{}.round_large_segment_bytes) {
    fail("cannot write round_large_segment_bytes = " +
         std::to_string(options.round_large_segment_bytes) +
         ": the config syntax has no key for it");
  }
  bool known_backend = false;
  for (std::string_view backend : kBackends)
    known_backend = known_backend || backend == config.backend;
  if (!known_backend) fail("cannot write unknown backend '" + config.backend + "'");
  check_combination(config);

  std::string text;
  for (const KeySpec& spec : key_table()) {
    std::string value;
    switch (spec.kind) {
      case ValueKind::kBackend: value = config.backend; break;
      case ValueKind::kBool: value = options.*(spec.flag) ? "true" : "false"; break;
      case ValueKind::kSize: {
        const std::size_t bytes = options.*(spec.size.field);
        // The cap has two spellings: whole GiB read best as cap_gb, anything else as cap_mb;
        // the slack too: whole percents as cross_stream_slack_pct, else in per mille.
        if (spec.setting == "cap") {
          const bool use_gb = bytes != 0 && bytes % kGiB == 0;
          if ((spec.name == "cap_gb") != use_gb) continue;
        }
        if (spec.setting == "cross_stream_slack") {
          const bool use_pct = bytes % 10 == 0;
          if ((spec.name == "cross_stream_slack_pct") != use_pct) continue;
        }
        if (bytes == kUnlimited && spec.size.accepts_unlimited) {
          value = "unlimited";
          break;
        }
        if (bytes % spec.size.unit != 0) {
          fail("cannot write " + std::string(spec.name) + " for " + std::to_string(bytes) +
               " bytes: not a whole number of " + spec.size.unit_name);
        }
        const std::size_t units = bytes / spec.size.unit;
        if (auto why = rule_violation(spec.size, units)) {
          fail("cannot write " + std::string(spec.name) + ":" + std::to_string(units) + ": " +
               *why);
        }
        value = std::to_string(units);
        break;
      }
    }
    if (!text.empty()) text += ',';
    text += spec.name;
    text += ':';
    text += value;
  }
  return text;
}

}  // namespace vramledger
