// The target that owns tests/pch/gtest_pch.hpp's precompiled form (tests/meson.build): meson
// compiles a precompiled header per target, and the test sources share this one.
namespace vramledger::test_pch_host {
int anchor = 0;
}  // namespace vramledger::test_pch_host
