/// \file driver.h
/// \brief The command line every stage program shares.
///
/// A stage's `main` is one line: `return fa::run_stage_cli(argc, argv, fa::stage05::info());`.
/// The driver parses the problem, makes seeded inputs, runs the stage (forward, and
/// backward with `--backward`), checks it against the reference, times it with `--bench`,
/// and prints one table. Exit codes: 0 pass, 1 check failed, 2 bad arguments or a problem
/// the stage refuses (one line on stderr).
#pragma once

#include "stage.h"

namespace fa {

int run_stage_cli(int argc, char** argv, const StageInfo& stage);

/// Reference FLOPs the driver is willing to spend on a check before it checks only the
/// first batches (or none) of a large benchmark problem.
inline constexpr double kMaxCheckFlops = 3e10;

}  // namespace fa
