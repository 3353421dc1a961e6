#include "bench/replay/tool_command_line.hpp"

#include <CLI/CLI.hpp>

#include "bench/replay/tool_flag_validators.hpp"

namespace vramledger {

struct ToolCommandLine::Parser {
  explicit Parser(const std::string& description) : app(description) {}
  CLI::App app;
};

ToolCommandLine::ToolCommandLine(const std::string& description)
    : parser_(std::make_unique<Parser>(description)) {}

ToolCommandLine::~ToolCommandLine() = default;

void ToolCommandLine::existing_file(const std::string& name, std::string& into,
                                    const std::string& help) {
  parser_->app.add_option(name, into, help)->required()->check(CLI::ExistingFile);
}

void ToolCommandLine::existing_files(const std::string& name, std::vector<std::string>& into,
                                     const std::string& help) {
  parser_->app.add_option(name, into, help)->required()->check(CLI::ExistingFile);
}

void ToolCommandLine::text(const std::string& name, std::string& into, const std::string& help) {
  parser_->app.add_option(name, into, help);
}

void ToolCommandLine::texts(const std::string& name, std::vector<std::string>& into,
                            const std::string& help) {
  parser_->app.add_option(name, into, help)->allow_extra_args(false);
}

void ToolCommandLine::capacity_gib(const std::string& name, double& into,
                                   const std::string& help) {
  parser_->app.add_option(name, into, help)->check(capacity_gib_validator());
}

void ToolCommandLine::whole_number(const std::string& name, std::size_t& into, std::uint64_t min,
                                   std::uint64_t max, const std::string& help) {
  parser_->app.add_option(name, into, help)->check(whole_number_validator(min, max));
}

void ToolCommandLine::flag(const std::string& name, bool& into, const std::string& help) {
  parser_->app.add_flag(name, into, help);
}

void ToolCommandLine::footer(const std::string& text) { parser_->app.footer(text); }

int ToolCommandLine::parse(int argc, char** argv) {
  CLI11_PARSE(parser_->app, argc, argv);
  return kRun;
}

}  // namespace vramledger
