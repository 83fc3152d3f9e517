// The `loadstone` subcommands. Each registers its options on the CLI11 app and returns the
// exit code through `*exit_code` when it runs.
#ifndef LOADSTONE_TOOLS_COMMANDS_H_
#define LOADSTONE_TOOLS_COMMANDS_H_

#include <string>

#include <CLI/CLI.hpp>

namespace loadstone::cli {

void AddInspectCommand(CLI::App& app, int* exit_code);
void AddPlanCommand(CLI::App& app, int* exit_code);
// `argv0`: how the binary was run, for the commands the demo suggests next.
void AddDemoCommand(CLI::App& app, int* exit_code, const std::string& argv0);
void AddLoadCommand(CLI::App& app, int* exit_code);
void AddBenchCommand(CLI::App& app, int* exit_code);
void AddConvertCommand(CLI::App& app, int* exit_code);
void AddLaunchCommand(CLI::App& app, int* exit_code);

}  // namespace loadstone::cli

#endif  // LOADSTONE_TOOLS_COMMANDS_H_
