// loadstone: inspect, plan, load and benchmark model checkpoints.
#include <CLI/CLI.hpp>

#include "tools/loadstone/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"loadstone: stream model checkpoints into CPU and GPU memory"};
  app.require_subcommand(1);
  int exit_code = 0;
  loadstone::cli::AddInspectCommand(app, &exit_code);
  loadstone::cli::AddPlanCommand(app, &exit_code);
  loadstone::cli::AddDemoCommand(app, &exit_code);
  loadstone::cli::AddLoadCommand(app, &exit_code);
  loadstone::cli::AddBenchCommand(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return exit_code;
}
