// loadstone: inspect, plan, load and benchmark model checkpoints.
#include <cerrno>
#include <cstring>
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "loadstone/status.h"
#include "loadstone/version.h"
#include "tools/loadstone/commands.h"
#include "tools/loadstone/format.h"

namespace {

// The command the user was running, for "see 'loadstone plan --help'".
std::string HelpHint(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands()) {
    return fmt::format("; see 'loadstone {} --help'", sub->get_name());
  }
  return "; see 'loadstone --help'";
}

int Run(int argc, char** argv) {
  CLI::App app{"loadstone: stream model checkpoints into CPU and GPU memory"};
  app.set_version_flag("--version", fmt::format("loadstone {}", LOADSTONE_VERSION_STRING));
  app.require_subcommand(1);
  int exit_code = 0;
  loadstone::cli::AddInspectCommand(app, &exit_code);
  loadstone::cli::AddPlanCommand(app, &exit_code);
  loadstone::cli::AddDemoCommand(app, &exit_code, argc > 0 ? argv[0] : "loadstone");
  loadstone::cli::AddLoadCommand(app, &exit_code);
  loadstone::cli::AddBenchCommand(app, &exit_code);
  loadstone::cli::AddConvertCommand(app, &exit_code);
  loadstone::cli::AddLaunchCommand(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() != 0) {
      return loadstone::cli::ReportError(
          loadstone::Status::InvalidArgument(std::string(e.what()) + HelpHint(app)));
    }
    exit_code = app.exit(e);  // --help, --version: their text must reach stdout too
  }
  // A full disk or a closed pipe on stdout is an error, not a quiet success.
  std::cout.flush();
  if (!std::cout) {
    return loadstone::cli::ReportError(loadstone::Status::IOError(
        fmt::format("cannot write to standard output: {}", std::strerror(errno))));
  }
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    // Never an abort: say it is a bug, with what was thrown.
    std::cerr << "error: internal error (a bug in loadstone, please report it): " << e.what()
              << "\n";
    return 1;
  }
}
