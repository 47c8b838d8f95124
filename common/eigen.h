/// \file eigen.h
/// \brief Eigen's dense core, as every file of the project includes it.
///
/// Built for this machine's instruction set (-march=native, the default), Eigen uses
/// AVX-512 where the CPU has it. GCC 12's own AVX-512 header initialises the value of
/// `_mm512_undefined_ps()` with itself, and every Eigen packet transpose that inlines it is
/// reported as "used uninitialized" (GCC bug 105593). The warning points into that header,
/// so silencing it for the lines included here leaves it on for the project's own code.
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
