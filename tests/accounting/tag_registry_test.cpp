#include "accounting/tag_registry.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace vramledger {
namespace {

std::string numbered(const char* prefix, std::size_t number) {
  return std::string(prefix).append(std::to_string(number));
}

TEST(TagRegistry, PredefinedTagsHaveFixedIds) {
  EXPECT_EQ(tag_name(kUntagged), "untagged");
  EXPECT_EQ(tag_name(kWeightsTag), "weights");
  EXPECT_EQ(tag_name(kKvCacheTag), "kv_cache");
  EXPECT_EQ(tag_name(kActivationsTag), "activations");
  EXPECT_EQ(register_tag("weights"), kWeightsTag);
  EXPECT_EQ(TagRegistry::global().find("kv_cache"), kKvCacheTag);
}

TEST(TagRegistry, InterningIsIdempotent) {
  const TagId first = register_tag("test.interning");
  EXPECT_EQ(register_tag("test.interning"), first);
  EXPECT_EQ(tag_name(first), "test.interning");
  EXPECT_FALSE(TagRegistry::global().find("test.never_registered").has_value());
}

TEST(TagRegistry, UnknownIdsGetAPlaceholderName) { EXPECT_EQ(tag_name(1023), "tag#1023"); }

TEST(TagRegistry, RejectsEmptyAndOverlongNames) {
  EXPECT_THROW(register_tag(""), Error);
  EXPECT_THROW(register_tag(std::string(kMaxTagNameBytes + 1, 'x')), Error);
  EXPECT_NO_THROW(register_tag(std::string(kMaxTagNameBytes, 'y')));
}

TEST(TagRegistry, IsBoundedWithAClearError) {
  TagRegistry registry;  // a private one, so the process-wide registry stays usable
  for (std::size_t i = registry.size(); i < kMaxTags; ++i) registry.intern(numbered("t", i));
  EXPECT_EQ(registry.size(), kMaxTags);
  EXPECT_EQ(registry.intern("t100"), 100);  // existing names still resolve
  try {
    registry.intern("one.too.many");
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(error.what()).find("1024"), std::string::npos);
  }
}

TEST(TagRegistry, ConcurrentRegistrationGivesOneIdPerName) {
  TagRegistry registry;
  constexpr int kThreads = 4;
  constexpr int kNames = 100;
  std::vector<std::vector<TagId>> ids(kThreads, std::vector<TagId>(kNames));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int n = 0; n < kNames; ++n) {
        ids[t][n] = registry.intern(numbered("concurrent.", static_cast<std::size_t>(n)));
        EXPECT_EQ(registry.name(ids[t][n]), numbered("concurrent.", static_cast<std::size_t>(n)));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::set<TagId> distinct;
  for (int n = 0; n < kNames; ++n) {
    for (int t = 1; t < kThreads; ++t) EXPECT_EQ(ids[t][n], ids[0][n]);
    distinct.insert(ids[0][n]);
  }
  EXPECT_EQ(distinct.size(), static_cast<std::size_t>(kNames));
}

TEST(TagScope, NestsAndRestores) {
  EXPECT_EQ(current_tag(), kUntagged);
  {
    TagScope weights(kWeightsTag);
    EXPECT_EQ(current_tag(), kWeightsTag);
    {
      TagScope named("test.scope");
      EXPECT_EQ(current_tag(), register_tag("test.scope"));
      {
        TagScope kv(kKvCacheTag);
        EXPECT_EQ(current_tag(), kKvCacheTag);
      }
      EXPECT_EQ(current_tag(), register_tag("test.scope"));
    }
    EXPECT_EQ(current_tag(), kWeightsTag);
  }
  EXPECT_EQ(current_tag(), kUntagged);
}

TEST(TagScope, IsPerThread) {
  TagScope outer(kActivationsTag);
  std::atomic<int> ready{0};
  std::atomic<bool> release{false};
  std::vector<TagId> seen_at_start(3), seen_inside(3), seen_after(3);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      seen_at_start[t] = current_tag();  // a new thread starts untagged
      {
        TagScope mine(static_cast<TagId>(100 + t));
        ++ready;
        while (!release) std::this_thread::yield();  // all scopes are open at the same time
        seen_inside[t] = current_tag();
      }
      seen_after[t] = current_tag();
    });
  }
  while (ready < 3) std::this_thread::yield();
  EXPECT_EQ(current_tag(), kActivationsTag);  // other threads' scopes do not leak here
  release = true;
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(seen_at_start[t], kUntagged);
    EXPECT_EQ(seen_inside[t], 100 + t);
    EXPECT_EQ(seen_after[t], kUntagged);
  }
  EXPECT_EQ(current_tag(), kActivationsTag);
}

}  // namespace
}  // namespace vramledger
