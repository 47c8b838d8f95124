/// \file fa_c_entry.h
/// \brief What every C ABI entry does around its call (stages/fa_c*.cpp, not installed): the
/// thread's last error, the exception-to-code wrapper, the plain refusal.
#pragma once

#include <stdexcept>
#include <string>

#include "errors.h"
#include "fa_c.h"
#include "problem.h"
#include "stage_list.h"

namespace fa::c_abi {

/// The calling thread's last error message (fa_last_error reads it): one per thread, so that
/// threads calling the library at once each read their own.
std::string& last_error_of_this_thread();

/// Refuses (std::invalid_argument) with `what` unless `ok`.
inline void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

/// Refuses (fa::NoCudaDevice: FA_ERR_RUNTIME with this message) a `_device` entry of `who`
/// on a machine without a CUDA device.
inline void require_gpu(const std::string& who) {
  if (!fa::gpu_available()) throw fa::NoCudaDevice(who + ": no CUDA device is available on this machine");
}

/// The C problem as a Problem, for a call of `who`: a NULL pointer and a `causal` that is not
/// 0 or 1 are refused here; the sizes are for Problem::validate (or the stage) to judge.
inline fa::Problem problem_of(const fa_problem* p, const std::string& who) {
  require(p != nullptr, who + ": problem pointer is NULL");
  require(p->causal == 0 || p->causal == 1, who + ": causal = " + std::to_string(p->causal) + " is not 0 or 1");
  fa::Problem q;
  q.batch = p->batch;
  q.heads = p->heads;
  q.kv_heads = p->kv_heads;
  q.seq_q = p->seq_q;
  q.seq_k = p->seq_k;
  q.head_dim = p->head_dim;
  q.causal = p->causal == 1;
  q.scale = p->scale;
  return q;
}

/// Runs an entry's body: FA_OK and an empty message, or the error code of what it threw
/// (invalid_argument: FA_ERR_INVALID; anything else: FA_ERR_RUNTIME) and its message.
template <typename Fn>
int guarded(Fn&& fn) {
  try {
    fn();
    last_error_of_this_thread().clear();
    return FA_OK;
  } catch (const std::invalid_argument& e) {
    last_error_of_this_thread() = e.what();
    return FA_ERR_INVALID;
  } catch (const std::exception& e) {
    last_error_of_this_thread() = e.what();
    return FA_ERR_RUNTIME;
  } catch (...) {
    last_error_of_this_thread() = "unknown error";
    return FA_ERR_RUNTIME;
  }
}

}  // namespace fa::c_abi
