// Runs `world` ranks as forked processes (each calls fn(rank) and exits) and waits for them,
// bounded: whatever is still running after `limit` is killed. Each rank reports by writing a
// JSON file the parent reads afterwards (ReadReport).
#ifndef LOADSTONE_TESTS_TESTING_FORK_RANKS_H_
#define LOADSTONE_TESTS_TESTING_FORK_RANKS_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace loadstone::testing {

// A port no earlier run holds: from the process id and `salt`, in the dynamic range.
inline int FreshPort(int salt) { return 20000 + (getpid() * 7 + salt * 101) % 20000; }

// The seconds until every rank ended (or was killed at `limit`); false in `all_ended` when one
// was killed.
inline double ForkRanks(int world, const std::function<void(int)>& fn, bool* all_ended = nullptr,
                        std::chrono::seconds limit = std::chrono::seconds(60)) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      fn(r);
      _exit(0);
    }
    pids.push_back(pid);
  }
  bool ended = true;
  for (pid_t pid : pids) {
    if (pid < 0) {
      ended = false;
      continue;
    }
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0 &&
           std::chrono::steady_clock::now() - start < limit) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (waitpid(pid, &status, WNOHANG) == 0) {
      ended = false;
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
  }
  if (all_ended != nullptr) *all_ended = ended;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A rank's report: the JSON document it wrote to `path`; null when it wrote none.
inline nlohmann::json ReadReport(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str().empty() ? nlohmann::json() : nlohmann::json::parse(text.str());
}

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_TESTING_FORK_RANKS_H_
