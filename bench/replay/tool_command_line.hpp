// The command line of the replay tools built with CLI11 (vramledger-replay, vramledger-report):
// CLI11 behind a small interface, so the header-only library is compiled in one translation unit
// for both tools instead of once in each main (such a unit takes ~10 s at -O3 and ~30 s under
// ASan+UBSan on the 2-core machine: the largest objects of scripts/run_tests.sh's builds).
// Each call below is the CLI11 call the tools made themselves, in the order made, so help text,
// checks and messages are CLI11's as before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace vramledger {

class ToolCommandLine {
 public:
  explicit ToolCommandLine(const std::string& description);
  ~ToolCommandLine();
  ToolCommandLine(const ToolCommandLine&) = delete;
  ToolCommandLine& operator=(const ToolCommandLine&) = delete;

  // A required positional argument naming an existing file; the plural takes one or more.
  void existing_file(const std::string& name, std::string& into, const std::string& help);
  void existing_files(const std::string& name, std::vector<std::string>& into,
                      const std::string& help);
  // `name VALUE`; the plural may be repeated, one value each time.
  void text(const std::string& name, std::string& into, const std::string& help);
  void texts(const std::string& name, std::vector<std::string>& into, const std::string& help);
  // `name GIB`, checked as text by tool_flags.hpp's parse_capacity_gib before conversion.
  void capacity_gib(const std::string& name, double& into, const std::string& help);
  // `name N`, a whole number in [min, max], checked as text by parse_whole_number.
  void whole_number(const std::string& name, std::size_t& into, std::uint64_t min,
                    std::uint64_t max, const std::string& help);
  void flag(const std::string& name, bool& into, const std::string& help);
  void footer(const std::string& text);

  // Parses argv as CLI11_PARSE does. Returns kRun when the tool should go on, else the status
  // main() must return (0 after --help; CLI11's, after printing the error, for a bad line).
  static constexpr int kRun = -1;
  int parse(int argc, char** argv);

 private:
  struct Parser;
  std::unique_ptr<Parser> parser_;
};

}  // namespace vramledger
