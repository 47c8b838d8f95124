// Stage 12: the rendezvous of ranks that share a process, and the transport between threads.
#include "transport.h"

#include <cstring>
#include <string>

#include "ring_plan.h"

namespace fa::stage12 {

void Rendezvous::arrive_and_wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (aborted_) throw RingAborted(std::string(kStageName) + ": another rank of the ring failed");
  const int64_t generation = generation_;
  if (++arrived_ == ranks_) {  // the last to arrive opens the barrier for everyone
    arrived_ = 0;
    ++generation_;
    all_arrived_.notify_all();
    return;
  }
  all_arrived_.wait(lock, [&] { return generation_ != generation || aborted_; });
  if (generation_ == generation) throw RingAborted(std::string(kStageName) + ": another rank of the ring failed");
}

void Rendezvous::abort() {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = true;
  all_arrived_.notify_all();
}

namespace {

// Rank r's end of a ring of threads: post the send buffer, wait for every rank, copy the
// previous rank's buffer; finish() waits again, until every copy out of `send` is done.
class ThreadTransport final : public Transport {
 public:
  ThreadTransport(Rendezvous& ring, int rank) : ring_(ring), rank_(rank) {}

  void start(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, void*) override {
    ring_.post(rank_) = {send, send_bytes, nullptr};
    ring_.arrive_and_wait();  // every rank has posted
    const Rendezvous::Post& from = ring_.post_of_previous(rank_);
    if (from.bytes != recv_bytes)
      throw std::logic_error(std::string(kStageName) + ": rank " + std::to_string(rank_) + " expects " +
                             std::to_string(recv_bytes) + " bytes, its previous rank sends " + std::to_string(from.bytes));
    if (recv_bytes > 0) std::memcpy(recv, from.send, recv_bytes);
  }

  void finish() override { ring_.arrive_and_wait(); }  // every rank has copied out of our `send`

 private:
  Rendezvous& ring_;
  int rank_;
};

}  // namespace

ThreadRing::ThreadRing(int ranks) : rendezvous_(ranks) {
  for (int r = 0; r < ranks; ++r) endpoints_.push_back(std::make_unique<ThreadTransport>(rendezvous_, r));
}

ThreadRing::~ThreadRing() = default;

}  // namespace fa::stage12
