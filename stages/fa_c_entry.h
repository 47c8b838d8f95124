/// \file fa_c_entry.h
/// \brief What every C ABI entry does around its call (stages/fa_c*.cpp, not installed): the
/// thread's last error, the exception-to-code wrapper, the plain refusal.
#pragma once

#include <stdexcept>
#include <string>

#include "fa_c.h"

namespace fa::c_abi {

/// The calling thread's last error message (fa_last_error reads it): one per thread, so that
/// threads calling the library at once each read their own.
std::string& last_error_of_this_thread();

/// Refuses (std::invalid_argument) with `what` unless `ok`.
inline void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
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
