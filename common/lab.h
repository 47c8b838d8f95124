/// \file lab.h
/// \brief Lab mode: what a student's stub calls in place of a region they must write.
///
/// Stage sources mark the regions a student writes with two plain comment lines:
///
///     // LAB BEGIN: online update — hint: rescale l and O by e^{m_old − m_new} before adding
///     ...solution code...
///     // LAB END
///
/// `scripts/lab/make_lab.py` replaces each region with its hint and `FA_LAB_TODO("05", "online update");`.
#pragma once

#include <stdexcept>
#include <string>

namespace fa {

/// Thrown by a stubbed lab region; the tests and the driver print its message.
struct NotImplemented : std::logic_error {
  NotImplemented(const std::string& stage, const std::string& region)
      : std::logic_error("not implemented: stage " + stage + ", region \"" + region + "\"") {}
};

}  // namespace fa

/// The stub a generated lab puts where a solution region was.
#define FA_LAB_TODO(stage, region) throw ::fa::NotImplemented(stage, region)
