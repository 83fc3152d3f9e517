// An environment variable set (or unset) for a scope, for the tests of what reads the
// environment (the Hub's and S3's settings); what was there before is put back.
#ifndef LOADSTONE_TESTS_TESTING_SCOPED_ENV_H_
#define LOADSTONE_TESTS_TESTING_SCOPED_ENV_H_

#include <cstdlib>
#include <optional>
#include <string>

namespace loadstone::testing {

// Sets an environment variable for the scope (unset: nullopt), then puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* was = std::getenv(name)) was_ = was;
    Set(value);
  }
  ~ScopedEnv() { Set(was_); }
  void Set(const std::optional<std::string>& value) {
    if (value) {
      ::setenv(name_, value->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> was_;
};

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_TESTING_SCOPED_ENV_H_
