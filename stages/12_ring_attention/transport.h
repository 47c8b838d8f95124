/// \file transport.h
/// \brief Stage 12: the transport seam. The ring loop (ring_attention.cpp) moves a buffer one
/// rank along the ring through this interface and never knows what carries it: a copy between
/// threads (the CPU ring, here), a device-to-device copy between virtual ranks on one GPU, or
/// NCCL between GPUs (ring_gpu.h).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace fa::stage12 {

/// One rank's end of a ring: it sends to rank r+1 and receives from rank r−1 (mod P).
class Transport {
 public:
  virtual ~Transport() = default;
  /// Starts sending `send_bytes` bytes of `send` to the next rank and receiving `recv_bytes`
  /// bytes from the previous rank into `recv` (the sizes of a pair of neighbours match). Every
  /// rank of the ring calls it, in the same order. On a GPU the exchange waits for the work
  /// already queued on `stream` (a cudaStream_t; it writes `send` and last reads `recv`), and
  /// runs beside what is queued after: that is the overlap of communication and compute.
  /// Neither buffer may be touched until finish() returns.
  virtual void start(const void* send, size_t send_bytes, void* recv, size_t recv_bytes, void* stream) = 0;
  /// Returns when this rank's exchange is complete: `recv` holds the data and `send` may be
  /// written again.
  virtual void finish() = 0;
};

/// The P ends of one ring, made before the ranks start.
class Ring {
 public:
  virtual ~Ring() = default;
  /// Rank `rank`'s end of the ring; it lives as long as the Ring.
  virtual Transport& endpoint(int rank) = 0;
  /// Called when a rank fails: every rank waiting in (or later entering) an exchange stops.
  virtual void abort() = 0;
};

/// Thrown in the other ranks of a ring when one rank failed: they stop instead of waiting forever.
struct RingAborted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// What the ranks of one ring share when they live in one process (threads, virtual ranks):
/// a barrier and a board where each rank posts the buffer it sends. The previous rank's post
/// is read after the barrier; the next exchange's posts are written only after the barrier
/// that ends this one, so a post is never read while it changes.
class Rendezvous {
 public:
  /// What a rank offers its next neighbour in one exchange.
  struct Post {
    const void* send = nullptr;
    size_t bytes = 0;
    void* ready = nullptr;  ///< GPU: a cudaEvent_t that completes when `send` is written
  };

  explicit Rendezvous(int ranks) : ranks_(ranks), posts_(size_t(ranks)) {}
  int ranks() const { return ranks_; }
  Post& post(int rank) { return posts_[size_t(rank)]; }
  const Post& post_of_previous(int rank) const { return posts_[size_t((rank + ranks_ - 1) % ranks_)]; }

  /// Waits until all ranks have arrived. Throws RingAborted once abort() was called.
  void arrive_and_wait();
  /// Wakes every waiting rank with RingAborted, now and at every later arrival.
  void abort();

 private:
  int ranks_;
  std::vector<Post> posts_;
  std::mutex mutex_;
  std::condition_variable all_arrived_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  bool aborted_ = false;
};

/// A ring of P threads in one process: each exchange copies the previous rank's buffer with
/// memcpy. The copy happens inside start(), so the CPU ring shows the algorithm but does not
/// overlap the copy with compute (a thread cannot do both at once).
class ThreadRing final : public Ring {
 public:
  explicit ThreadRing(int ranks);
  ~ThreadRing() override;
  Transport& endpoint(int rank) override { return *endpoints_[size_t(rank)]; }
  void abort() override { rendezvous_.abort(); }

 private:
  Rendezvous rendezvous_;
  std::vector<std::unique_ptr<Transport>> endpoints_;
};

}  // namespace fa::stage12
