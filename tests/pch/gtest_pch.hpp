// Precompiled once per build for every test source compiled with test_deps (tests/meson.build):
// gtest's header is ~1.4 of the ~4-6 CPU-s such a source takes. Only gtest belongs here; a source
// still includes what it uses.
// (No #pragma once: GCC compiles this file as a main file, where it warns about one.)
#include <gtest/gtest.h>
