/// \file driver.h
/// \brief The command line every stage program shares.
///
/// A stage's `main` is one line: `return fa::run_stage_cli(argc, argv, fa::stage05::info());`.
/// The driver parses the problem, makes seeded inputs, runs the stage (forward, and
/// backward with `--backward`), checks it against the reference, times it with `--bench`,
/// and prints one table. Exit codes (errors.h): 0 pass (or the check skipped, or not asked
/// for, with finite outputs), 1 check failed, 2 bad arguments or a problem the stage refuses
/// or that does not fit in memory, 3 a run-time error, 4 not implemented (lab), 5 no CUDA
/// device; every failure is one line on stderr.
#pragma once

#include "stage.h"

namespace CLI {
class App;
}

namespace fa {

int run_stage_cli(int argc, char** argv, const StageInfo& stage);

/// Makes every option of `app` that takes a value refuse an empty one (`--seq-q ""`), which
/// CLI11 would otherwise read as 0. Call it after the last option is added.
void refuse_empty_values(CLI::App& app);

/// Reference FLOPs the driver is willing to spend on a check before it checks only the
/// first batches (or none) of a large benchmark problem. The environment variable
/// FA_MAX_CHECK_FLOPS overrides it (the tests use it to reach a skipped check cheaply).
inline constexpr double kMaxCheckFlops = 3e10;

/// The most timed runs --repeat accepts.
inline constexpr int kMaxRepeat = 100000;

}  // namespace fa
