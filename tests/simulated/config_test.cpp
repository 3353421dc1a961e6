// The PYTORCH_CUDA_ALLOC_CONF-style configuration parser: every key, every error, round trips.
#include "allocator/config.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "allocator/errors.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;
constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max();

void expect_same(const Config& a, const Config& b) {
  EXPECT_EQ(a.backend, b.backend);
  EXPECT_EQ(a.options.round_bytes, b.options.round_bytes);
  EXPECT_EQ(a.options.small_size_limit, b.options.small_size_limit);
  EXPECT_EQ(a.options.small_segment_bytes, b.options.small_segment_bytes);
  EXPECT_EQ(a.options.large_segment_bytes, b.options.large_segment_bytes);
  EXPECT_EQ(a.options.round_large_segment_bytes, b.options.round_large_segment_bytes);
  EXPECT_EQ(a.options.max_split_bytes, b.options.max_split_bytes);
  EXPECT_EQ(a.options.page_bytes, b.options.page_bytes);
  EXPECT_EQ(a.options.span_bytes, b.options.span_bytes);
  EXPECT_EQ(a.options.max_free_mapped_bytes, b.options.max_free_mapped_bytes);
  EXPECT_EQ(a.options.max_free_physical_bytes, b.options.max_free_physical_bytes);
  EXPECT_EQ(a.options.cap_bytes, b.options.cap_bytes);
  EXPECT_EQ(a.options.cross_stream_slack_permille, b.options.cross_stream_slack_permille);
  EXPECT_EQ(a.options.use_paged_heap, b.options.use_paged_heap);
  EXPECT_EQ(a.options.front_cache_bytes, b.options.front_cache_bytes);
}

// Parsing `text` fails with kInvalidArgument and a message holding every one of `parts`.
void expect_error(const std::string& text, const std::vector<std::string>& parts) {
  try {
    (void)parse_config(text);
    ADD_FAILURE() << "parse_config accepted '" << text << "'";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << text;
    const std::string message = error.what();
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos)
          << "'" << text << "' gave: " << message << "\n(expected to mention '" << part << "')";
    }
  }
}

TEST(ConfigParse, EmptyOrBlankMeansDefaults) {
  for (const char* text : {"", " ", " \t\n "}) {
    const Config config = parse_config(text);
    expect_same(config, Config{});
    EXPECT_EQ(config.backend, "auto");
  }
}

TEST(ConfigParse, EveryBackend) {
  for (const char* name : {"auto", "simulated", "cuda_malloc", "vmm", "malloc_async"}) {
    EXPECT_EQ(parse_config(std::string("backend:") + name).backend, name);
  }
  expect_error("backend:cuda", {"backend", "'cuda'"});
  expect_error("backend:VMM", {"backend", "'VMM'"});
}

TEST(ConfigParse, EverySizeKeyWithItsUnit) {
  const Config config = parse_config(
      "round_bytes:1024,small_size_limit_kb:512,small_segment_mb:4,large_segment_mb:40,"
      "max_split_mb:200,page_mb:4,span_gb:64,max_free_mapped_mb:128,max_free_physical_mb:512,"
      "cap_mb:70000");
  EXPECT_EQ(config.options.round_bytes, 1024u);
  EXPECT_EQ(config.options.small_size_limit, 512 * kKiB);
  EXPECT_EQ(config.options.small_segment_bytes, 4 * kMiB);
  EXPECT_EQ(config.options.large_segment_bytes, 40 * kMiB);
  EXPECT_EQ(config.options.max_split_bytes, 200 * kMiB);
  EXPECT_EQ(config.options.page_bytes, 4 * kMiB);
  EXPECT_EQ(config.options.span_bytes, 64 * kGiB);
  EXPECT_EQ(config.options.max_free_mapped_bytes, 128 * kMiB);
  EXPECT_EQ(config.options.max_free_physical_bytes, 512 * kMiB);
  EXPECT_EQ(config.options.cap_bytes, 70000 * kMiB);
  EXPECT_EQ(config.backend, "auto");
  // Untouched fields keep their defaults.
  EXPECT_EQ(config.options.round_large_segment_bytes, AllocatorOptions{}.round_large_segment_bytes);
  EXPECT_EQ(config.options.use_paged_heap, AllocatorOptions{}.use_paged_heap);
}

TEST(ConfigParse, FrontCacheInMegabytesOffByDefault) {
  EXPECT_EQ(parse_config("").options.front_cache_bytes, 0u);
  EXPECT_EQ(parse_config("front_cache_mb:256").options.front_cache_bytes, 256 * kMiB);
  const Config config = parse_config("backend:vmm,front_cache_mb:64");
  EXPECT_EQ(to_string(parse_config(to_string(config))), to_string(config));
  EXPECT_NE(to_string(config).find("front_cache_mb:64"), std::string::npos) << to_string(config);
  expect_error("front_cache_mb:-1", {"front_cache_mb"});
}

TEST(ConfigParse, CapInGigabytes) {
  EXPECT_EQ(parse_config("cap_gb:40").options.cap_bytes, 40 * kGiB);
  EXPECT_EQ(parse_config("cap_gb:0").options.cap_bytes, 0u);
}

TEST(ConfigParse, PagedHeapBoolean) {
  EXPECT_FALSE(parse_config("paged_heap:false").options.use_paged_heap);
  EXPECT_TRUE(parse_config("paged_heap:true").options.use_paged_heap);
  EXPECT_FALSE(parse_config("paged_heap:False").options.use_paged_heap);
  EXPECT_TRUE(parse_config("paged_heap:TRUE").options.use_paged_heap);
  expect_error("paged_heap:yes", {"paged_heap", "'yes'", "true or false"});
  expect_error("paged_heap:1", {"paged_heap", "'1'"});
}

TEST(ConfigParse, UnlimitedFreeCaches) {
  const Config config = parse_config("max_free_mapped_mb:unlimited,max_free_physical_mb:unlimited");
  EXPECT_EQ(config.options.max_free_mapped_bytes, kUnlimited);
  EXPECT_EQ(config.options.max_free_physical_bytes, kUnlimited);
  expect_error("cap_mb:unlimited", {"cap_mb", "'unlimited'"});
  expect_error("page_mb:unlimited", {"page_mb", "'unlimited'"});
}

TEST(ConfigParse, ZeroWhereZeroMeansSomething) {
  const Config config = parse_config(
      "small_size_limit_kb:0,max_split_mb:0,page_mb:0,span_gb:0,max_free_mapped_mb:0,"
      "max_free_physical_mb:0,cap_mb:0");
  EXPECT_EQ(config.options.small_size_limit, 0u);
  EXPECT_EQ(config.options.max_split_bytes, 0u);
  EXPECT_EQ(config.options.page_bytes, 0u);
  EXPECT_EQ(config.options.span_bytes, 0u);
  EXPECT_EQ(config.options.max_free_mapped_bytes, 0u);
  EXPECT_EQ(config.options.max_free_physical_bytes, 0u);
  EXPECT_EQ(config.options.cap_bytes, 0u);
}

TEST(ConfigParse, ZeroWhereZeroMeansNothing) {
  expect_error("round_bytes:0", {"round_bytes", "'0'"});
  expect_error("small_segment_mb:0", {"small_segment_mb", "'0'"});
  expect_error("large_segment_mb:0", {"large_segment_mb", "'0'"});
}

TEST(ConfigParse, WhitespaceAroundTokens) {
  const Config config =
      parse_config("  backend : vmm ,\tround_bytes:\t2048 ,paged_heap :false\n, cap_gb: 2 ");
  EXPECT_EQ(config.backend, "vmm");
  EXPECT_EQ(config.options.round_bytes, 2048u);
  EXPECT_FALSE(config.options.use_paged_heap);
  EXPECT_EQ(config.options.cap_bytes, 2 * kGiB);
}

TEST(ConfigParse, LeadingZerosAreJustDigits) {
  EXPECT_EQ(parse_config("round_bytes:0512").options.round_bytes, 512u);
}

TEST(ConfigErrors, UnknownKey) {
  expect_error("expandable_segments:True", {"unknown key", "expandable_segments"});
  expect_error("Round_Bytes:512", {"Round_Bytes"});
  expect_error("round_bytes:512,garbage", {"garbage"});
}

TEST(ConfigErrors, DuplicateKeys) {
  expect_error("round_bytes:512,round_bytes:1024", {"round_bytes", "twice", "'1024'"});
  expect_error("backend:vmm, backend:vmm", {"backend", "twice"});
  expect_error("cap_mb:100,cap_gb:1", {"cap_gb", "'1'", "cap_mb"});
  expect_error("cap_gb:1,cap_mb:100", {"cap_mb", "'100'", "cap_gb"});
}

TEST(ConfigErrors, MissingValueOrKey) {
  expect_error("round_bytes", {"round_bytes", "no value"});
  expect_error("round_bytes:", {"round_bytes", "no value"});
  expect_error("round_bytes:  ", {"round_bytes", "no value"});
  expect_error("backend:", {"backend", "no value"});
  expect_error(":512", {"no key", ":512"});
  expect_error(" : ", {"no key"});
}

TEST(ConfigErrors, EmptyEntries) {
  expect_error("round_bytes:512,,paged_heap:true", {"empty entry"});
  expect_error("round_bytes:512,", {"empty entry"});
  expect_error(",round_bytes:512", {"empty entry"});
  expect_error(",", {"empty entry"});
}

TEST(ConfigErrors, NonNumericValues) {
  for (const char* value : {"abc", "12abc", "1.5", "0x10", "+5", "1e6", "5 5", "½"}) {
    expect_error(std::string("large_segment_mb:") + value, {"large_segment_mb", value});
  }
  expect_error("round_bytes:512:1024", {"round_bytes", "512:1024"});
}

TEST(ConfigErrors, NegativeValues) {
  expect_error("small_segment_mb:-2", {"small_segment_mb", "'-2'", "negative"});
  expect_error("cap_gb:-1", {"cap_gb", "'-1'", "negative"});
  expect_error("round_bytes:-512", {"round_bytes", "negative"});
}

TEST(ConfigErrors, OverflowingValues) {
  expect_error("cap_mb:99999999999999999999999", {"cap_mb", "99999999999999999999999", "large"});
  // Fits in 64 bits as a count, not once multiplied by the unit.
  expect_error("span_gb:17179869184", {"span_gb", "17179869184"});
  expect_error("cap_mb:17592186044416", {"cap_mb", "17592186044416"});
  expect_error("small_size_limit_kb:18014398509481984", {"small_size_limit_kb"});
}

TEST(ConfigErrors, RoundBytesMustBeAPowerOfTwo) {
  for (const char* value : {"3", "768", "1000"}) {
    expect_error(std::string("round_bytes:") + value, {"round_bytes", value, "power of two"});
  }
  for (std::size_t shift = 0; shift <= 30; shift += 3) {
    const std::size_t bytes = std::size_t{1} << shift;
    EXPECT_EQ(parse_config("round_bytes:" + std::to_string(bytes)).options.round_bytes, bytes);
  }
}

// Every number is bounded by what a device can mean (issue 16): a power-of-two rounding near 2^62
// made the paged heap loop forever, one of 2^43 mapped the whole device per request.
TEST(ConfigBounds, RoundingAtMostOneGiB) {
  EXPECT_EQ(parse_config("round_bytes:1073741824").options.round_bytes, kGiB);
  expect_error("round_bytes:2147483648", {"round_bytes", "'2147483648'", "at most 1073741824"});
  expect_error("round_bytes:8796093022208", {"round_bytes", "8796093022208"});        // 2^43
  expect_error("round_bytes:4611686018427387904", {"round_bytes", "4611686018427387904"});  // 2^62
  expect_error("round_bytes:9223372036854775808", {"round_bytes", "at most"});         // 2^63
}

TEST(ConfigBounds, PageAtMostOneGiB) {
  EXPECT_EQ(parse_config("page_mb:1024").options.page_bytes, kGiB);
  expect_error("page_mb:1025", {"page_mb", "'1025'", "at most 1024 MiB"});
  expect_error("page_mb:17592186044415", {"page_mb"});
}

TEST(ConfigBounds, SpanAtMostEightTiB) {
  EXPECT_EQ(parse_config("span_gb:8192").options.span_bytes, 8192 * kGiB);
  expect_error("span_gb:8193", {"span_gb", "'8193'", "at most 8192 GiB"});
  expect_error("span_gb:17179869183", {"span_gb"});
}

TEST(ConfigBounds, EveryMemorySizeAtMostFourTiB) {
  for (const char* key : {"small_segment_mb", "large_segment_mb", "max_split_mb", "map_chunk_mb",
                          "max_free_mapped_mb", "max_free_physical_mb", "cap_mb"}) {
    EXPECT_NO_THROW((void)parse_config(std::string(key) + ":4194304")) << key;
    expect_error(std::string(key) + ":4194305",
                 {key, "'4194305'", "at most 4194304 MiB", "more memory than any device has"});
  }
  EXPECT_EQ(parse_config("cap_gb:4096").options.cap_bytes, 4096 * kGiB);
  expect_error("cap_gb:4097", {"cap_gb", "at most 4096 GiB"});
  expect_error("small_size_limit_kb:4294967297,small_segment_mb:4194304",
               {"small_size_limit_kb", "at most 4294967296 KiB"});
}

TEST(ConfigBounds, SlackAtMostTenThousandPercent) {
  EXPECT_EQ(parse_config("cross_stream_slack_pct:10000").options.cross_stream_slack_permille,
            100000u);
  expect_error("cross_stream_slack_pct:10001", {"cross_stream_slack_pct", "at most 10000"});
  expect_error("cross_stream_slack_pct:18446744073709551615", {"cross_stream_slack_pct"});
  EXPECT_EQ(parse_config("cross_stream_slack_permille:100000").options.cross_stream_slack_permille,
            100000u);
  expect_error("cross_stream_slack_permille:100001",
               {"cross_stream_slack_permille", "at most 100000 per mille"});
}

// The slack in percent or per mille: one setting, two spellings, like the cap.
TEST(ConfigKeys, SlackInPercentOrPerMille) {
  EXPECT_EQ(AllocatorOptions{}.cross_stream_slack_permille, 10u);
  EXPECT_EQ(parse_config("cross_stream_slack_pct:2").options.cross_stream_slack_permille, 20u);
  EXPECT_EQ(parse_config("cross_stream_slack_permille:5").options.cross_stream_slack_permille,
            5u);
  expect_error("cross_stream_slack_pct:1,cross_stream_slack_permille:5",
               {"cross_stream_slack_permille", "cross_stream_slack_pct and "
                                               "cross_stream_slack_permille"});
  Config half;
  half.options.cross_stream_slack_permille = 5;
  const std::string written = to_string(half);
  EXPECT_NE(written.find("cross_stream_slack_permille:5"), std::string::npos) << written;
  EXPECT_EQ(written.find("cross_stream_slack_pct:"), std::string::npos) << written;
  EXPECT_EQ(parse_config(written).options.cross_stream_slack_permille, 5u);
  const std::string whole = to_string(Config{});
  EXPECT_NE(whole.find("cross_stream_slack_pct:1,"), std::string::npos) << whole;
  EXPECT_EQ(whole.find("cross_stream_slack_permille:"), std::string::npos) << whole;
}

TEST(ConfigErrors, SmallRequestsMustFitASmallSegment) {
  expect_error("small_size_limit_kb:4096", {"small_size_limit_kb", "4096", "small_segment_mb"});
  const Config config = parse_config("small_size_limit_kb:4096,small_segment_mb:4");
  EXPECT_EQ(config.options.small_size_limit, 4 * kMiB);
}

TEST(ConfigErrors, MessagesCarryTheErrorCodeText) {
  try {
    (void)parse_config("bogus:1");
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()).rfind("invalid argument", 0), 0u) << error.what();
  }
}

// --- to_string ---

TEST(ConfigToString, DefaultsRoundTrip) {
  const std::string text = to_string(Config{});
  expect_same(parse_config(text), Config{});
  EXPECT_EQ(text.rfind("backend:auto,round_bytes:512,", 0), 0u) << text;
}

TEST(ConfigToString, EveryKeyIsWritten) {
  const std::string text = to_string(Config{});
  for (const char* key :
       {"backend:", "round_bytes:", "small_size_limit_kb:", "small_segment_mb:",
        "large_segment_mb:", "max_split_mb:", "page_mb:", "span_gb:", "max_free_mapped_mb:",
        "max_free_physical_mb:", "cap_mb:", "paged_heap:"}) {
    EXPECT_NE(text.find(key), std::string::npos) << key << " missing from " << text;
  }
}

TEST(ConfigToString, NonDefaultConfigRoundTrips) {
  const std::vector<std::string> texts = {
      "backend:vmm,round_bytes:4096,small_size_limit_kb:0,small_segment_mb:8,large_segment_mb:64,"
      "max_split_mb:512,page_mb:8,span_gb:256,max_free_mapped_mb:0,max_free_physical_mb:unlimited,"
      "cap_gb:70,paged_heap:false",
      "backend:simulated,cap_mb:1536",
      "backend:malloc_async,max_free_mapped_mb:unlimited,max_free_physical_mb:100",
      "backend:cuda_malloc,cap_mb:0",
      "backend:vmm,cross_stream_slack_permille:5",
      "backend:vmm,cross_stream_slack_permille:30"};
  for (const std::string& text : texts) {
    const Config parsed = parse_config(text);
    const std::string written = to_string(parsed);
    expect_same(parse_config(written), parsed);
    EXPECT_EQ(to_string(parse_config(written)), written);  // stable
  }
}

TEST(ConfigToString, CapPicksTheReadableUnit) {
  Config config;
  config.options.cap_bytes = 40 * kGiB;
  EXPECT_NE(to_string(config).find("cap_gb:40"), std::string::npos) << to_string(config);
  EXPECT_EQ(to_string(config).find("cap_mb"), std::string::npos);
  config.options.cap_bytes = 40 * kGiB + 512 * kMiB;
  EXPECT_NE(to_string(config).find("cap_mb:41472"), std::string::npos) << to_string(config);
  EXPECT_EQ(to_string(config).find("cap_gb"), std::string::npos);
  config.options.cap_bytes = 0;
  EXPECT_NE(to_string(config).find("cap_mb:0"), std::string::npos);
}

TEST(ConfigToString, RefusesWhatTheSyntaxCannotSay) {
  Config odd_cap;
  odd_cap.options.cap_bytes = 100;
  EXPECT_THROW((void)to_string(odd_cap), Error);
  Config odd_limit;
  odd_limit.options.small_size_limit = 1000;
  EXPECT_THROW((void)to_string(odd_limit), Error);
  Config odd_rounding;
  odd_rounding.options.round_bytes = 3;
  EXPECT_THROW((void)to_string(odd_rounding), Error);
  Config zero_segment;
  zero_segment.options.large_segment_bytes = 0;
  EXPECT_THROW((void)to_string(zero_segment), Error);
  Config no_key;
  no_key.options.round_large_segment_bytes = 4 * kMiB;
  EXPECT_THROW((void)to_string(no_key), Error);
  Config bad_backend;
  bad_backend.backend = "tpu";
  EXPECT_THROW((void)to_string(bad_backend), Error);
}

}  // namespace
}  // namespace vramledger
