/// \file errors.h
/// \brief How every program ends on a failure: one line on stderr and a documented exit code.
///
/// The stage programs, the tour and bench06 catch everything at the top of `main` and hand
/// it to report_failure(), so no failure (an exception, an allocation failure) ever ends a
/// program with an uncaught exception or a second line of output.
#pragma once

#include <exception>
#include <stdexcept>
#include <string>

namespace fa {

/// Exit codes of every program (README, "Exit codes").
enum ExitCode : int {
  kExitPass = 0,         ///< the check passed (or was skipped / not asked for)
  kExitCheckFailed = 1,  ///< the output does not match the reference
  kExitBadInput = 2,  ///< bad arguments, a problem the stage refuses, or one too large to allocate
  kExitRuntimeError = 3,    ///< the run failed (e.g. a CUDA error)
  kExitNotImplemented = 4,  ///< a lab stub was reached (lab.h)
  kExitNoDevice = 5,        ///< a GPU stage on a machine without a usable CUDA device
};

/// Thrown when a buffer of a problem cannot be allocated (host or device); the message
/// names the buffer and the size it needed. The programs treat it as a refused problem.
struct OutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Thrown when a GPU stage is asked to run and no CUDA device is usable.
struct NoCudaDevice : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Prints `error` as one line on stderr, prefixed "<program>: " unless the message already
/// starts with it, and returns its exit code: std::invalid_argument and allocation failures
/// (OutOfMemory, std::bad_alloc, std::length_error) 2, NotImplemented 4, NoCudaDevice 5,
/// anything else 3.
int report_failure(const std::string& program, const std::exception_ptr& error);

}  // namespace fa
