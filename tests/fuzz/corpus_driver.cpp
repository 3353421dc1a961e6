// main() for the fuzz targets where the compiler has no libFuzzer (GCC): runs every file of the
// given files and folders through LLVMFuzzerTestOneInput once, so the seed corpus and every
// crasher kept beside it are regression tests in every build.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

std::size_t run_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t inputs = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path path = argv[i];
    if (std::filesystem::is_directory(path)) {
      for (const auto& entry : std::filesystem::recursive_directory_iterator(path)) {
        if (entry.is_regular_file()) inputs += run_file(entry.path());
      }
    } else {
      inputs += run_file(path);
    }
  }
  if (inputs == 0) {
    std::fprintf(stderr, "no inputs found in the given paths\n");
    return 1;
  }
  std::printf("%zu inputs ran without a failure\n", inputs);
  return 0;
}
