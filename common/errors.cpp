#include "errors.h"

#include <iostream>
#include <new>

#include "lab.h"

namespace fa {

namespace {

// The message on one line: newlines become spaces.
std::string one_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

int print(const std::string& program, const std::string& message, int code) {
  const std::string m = one_line(message);
  const bool has_prefix = m.compare(0, program.size() + 1, program + ":") == 0;
  std::cerr << (has_prefix ? m : program + ": " + m) << "\n";
  return code;
}

}  // namespace

int report_failure(const std::string& program, const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::invalid_argument& e) {
    return print(program, e.what(), kExitBadInput);
  } catch (const OutOfMemory& e) {
    return print(program, e.what(), kExitBadInput);
  } catch (const std::bad_alloc&) {
    return print(program, "out of memory: the problem does not fit in this machine's memory",
                 kExitBadInput);
  } catch (const std::length_error& e) {
    return print(program, std::string("too large to allocate: ") + e.what(), kExitBadInput);
  } catch (const NotImplemented& e) {
    return print(program, e.what(), kExitNotImplemented);
  } catch (const NoCudaDevice& e) {
    return print(program, e.what(), kExitNoDevice);
  } catch (const std::exception& e) {
    return print(program, std::string("error: ") + e.what(), kExitRuntimeError);
  } catch (...) {
    return print(program, "error: unknown exception", kExitRuntimeError);
  }
}

}  // namespace fa
