// Runs the built `loadstone` binary as a person does: with pipes (stdout, stderr and the exit
// code apart) or under a pseudo-terminal of a given width, where the progress bar is drawn and
// Ctrl-C is a keystroke the terminal turns into SIGINT.
#ifndef LOADSTONE_TESTS_TOOLS_CLI_RUNNER_H_
#define LOADSTONE_TESTS_TOOLS_CLI_RUNNER_H_

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/temp_dir.h"

namespace loadstone::testing {

inline std::string Binary() { return std::string(LOADSTONE_BINARY_DIR) + "/loadstone"; }

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct CliRun {
  int code = -1;  // the exit code, or 128 + the signal that ended it
  std::string out;
  std::string err;
};

// `args` as a shell would split them (the test writes them); stdout and stderr to files.
inline CliRun RunCli(const std::string& args, const std::string& stdout_to = "") {
  TempDir dir;
  const std::string out = stdout_to.empty() ? dir.Path("out") : stdout_to;
  const std::string cmd = Binary() + " " + args + " >" + out + " 2>" + dir.Path("err") + " </dev/null";
  const int status = std::system(cmd.c_str());
  CliRun run;
  run.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (stdout_to.empty()) run.out = Slurp(out);
  run.err = Slurp(dir.Path("err"));
  return run;
}

struct PtyRun {
  int code = -1;            // the exit code, or 128 + signal
  std::string screen;       // everything the terminal received
  bool timed_out = false;
};

// Runs loadstone with `argv` under a pseudo-terminal `columns` wide. `on_output` sees what has
// come so far after every read and may write keystrokes to the terminal (its fd). Gives up
// (kills the child) after `limit`.
inline PtyRun RunInPty(const std::vector<std::string>& argv, int columns,
                       const std::function<void(const std::string&, int fd)>& on_output = {},
                       std::chrono::seconds limit = std::chrono::seconds(120)) {
  struct winsize ws{};
  ws.ws_col = static_cast<unsigned short>(columns);
  ws.ws_row = 24;
  int master = -1;
  const std::string binary = Binary();
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, &ws);
  if (pid == 0) {
    std::vector<char*> args;
    args.push_back(const_cast<char*>(binary.c_str()));
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::unsetenv("COLUMNS");
    ::execv(binary.c_str(), args.data());
    ::_exit(127);
  }
  PtyRun run;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  char buffer[4096];
  while (true) {
    struct pollfd p{master, POLLIN, 0};
    const int ready = ::poll(&p, 1, 100);
    if (std::chrono::steady_clock::now() > deadline) {
      run.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    if (ready <= 0) continue;
    const ssize_t n = ::read(master, buffer, sizeof(buffer));
    if (n <= 0) break;  // EIO: the child closed the terminal
    run.screen.append(buffer, static_cast<size_t>(n));
    if (on_output) on_output(run.screen, master);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(master);
  run.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return run;
}

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_TOOLS_CLI_RUNNER_H_
