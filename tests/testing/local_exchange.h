// An Exchange (loadstone/tensor_parallel.h) between threads of one process: the ranks of a
// tensor-parallel group in a unit test, where the real one (c10d) needs processes. Each rank's
// AllToAll publishes its send buffer, waits for all, copies what the others sent it, and waits
// again before any buffer may be reused.
#ifndef LOADSTONE_TESTS_TESTING_LOCAL_EXCHANGE_H_
#define LOADSTONE_TESTS_TESTING_LOCAL_EXCHANGE_H_

#include <barrier>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "loadstone/tensor_parallel.h"

namespace loadstone::testing {

class LocalGroup {
 public:
  explicit LocalGroup(int size) : size_(size), barrier_(size), posted_(size) {}

  class Member : public Exchange {
   public:
    Member(LocalGroup* group, int rank) : group_(group), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return group_->size_; }
    Status AllToAll(std::span<const std::byte> send, std::span<const uint64_t> send_counts,
                    std::span<std::byte> recv, std::span<const uint64_t> recv_counts) override {
      group_->posted_[rank_] = {send, {send_counts.begin(), send_counts.end()}};
      group_->barrier_.arrive_and_wait();
      uint64_t at = 0;
      Status status = Status::OK();
      for (int r = 0; r < size(); ++r) {
        const Posted& from = group_->posted_[r];
        uint64_t offset = 0;
        for (int q = 0; q < rank_; ++q) offset += from.counts[q];
        if (from.counts[rank_] != recv_counts[r]) {
          status = Status::InvalidArgument("counts differ between sender and receiver");
        } else {
          std::memcpy(recv.data() + at, from.send.data() + offset, recv_counts[r]);
        }
        at += recv_counts[r];
      }
      group_->barrier_.arrive_and_wait();
      return status;
    }

   private:
    LocalGroup* group_;
    int rank_;
  };

  std::unique_ptr<Member> member(int rank) { return std::make_unique<Member>(this, rank); }

 private:
  struct Posted {
    std::span<const std::byte> send;
    std::vector<uint64_t> counts;
  };
  int size_;
  std::barrier<> barrier_;
  std::vector<Posted> posted_;
};

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_TESTING_LOCAL_EXCHANGE_H_
