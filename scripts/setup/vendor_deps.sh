#!/usr/bin/env bash
# Copies the project's header-only dependencies (Eigen, doctest, CLI11) with their CMake
# package files from this machine's Debian packages into a prefix, .deps/usr by default:
#
#   .deps/usr/include/{eigen3,doctest,CLI}
#   .deps/usr/share/eigen3/cmake   .deps/usr/lib/cmake/doctest   .deps/usr/share/cmake/CLI11
#
# The GPU machine has no network and none of these installed; the prefix travels with the
# working tree (it is git-ignored: name .deps in the device tool's `carry`), and
# scripts/gpu/check.sh configures with -DCMAKE_PREFIX_PATH=$PWD/.deps/usr.
# The relative layout is kept, so each package's config file finds its headers relative to
# itself; doctest's exported targets name /usr literally, so that one line is rewritten.
# Finally a throw-away CMake project checks that all three packages resolve into the prefix.
#
# Usage: scripts/setup/vendor_deps.sh [prefix]        (needs: libeigen3-dev doctest-dev libcli11-dev)
set -euo pipefail
cd "$(dirname "$0")/../.."
prefix=${1:-.deps/usr}
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)

sources=(/usr/include/eigen3 /usr/include/doctest /usr/include/CLI
         /usr/share/eigen3/cmake /usr/lib/cmake/doctest /usr/share/cmake/CLI11)
for src in "${sources[@]}"; do
  if [[ ! -e $src ]]; then
    echo "vendor_deps: $src not found (apt-get install libeigen3-dev doctest-dev libcli11-dev)" >&2
    exit 1
  fi
  dst=$prefix/${src#/usr/}
  mkdir -p "$(dirname "$dst")"
  rm -rf "$dst"
  cp -a "$src" "$dst"
done

# doctest's doctestTargets.cmake says set(_IMPORT_PREFIX "/usr"); compute it from the file's
# own location instead (lib/cmake/doctest → three levels up is the prefix).
targets=$prefix/lib/cmake/doctest/doctestTargets.cmake
# shellcheck disable=SC2016  # the ${...} is CMake's, written literally
sed -i 's|^set(_IMPORT_PREFIX "/usr")$|get_filename_component(_IMPORT_PREFIX "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)|' "$targets"
if grep -q '"/usr"' "$targets"; then
  echo "vendor_deps: could not make $targets relocatable" >&2
  exit 1
fi

# Verify: configure a tiny project against the prefix and require that every package and
# its include directory come from inside it.
check=$(mktemp -d)
trap 'rm -rf "$check"' EXIT
cat >"$check/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.16)
project(vendor_check LANGUAGES NONE)
find_package(Eigen3 3.3 REQUIRED NO_MODULE)
find_package(doctest REQUIRED)
find_package(CLI11 REQUIRED)
foreach(pair "Eigen3::Eigen;Eigen/Core" "doctest::doctest;doctest/doctest.h" "CLI11::CLI11;CLI/CLI.hpp")
  list(GET pair 0 target)
  list(GET pair 1 header)
  get_target_property(dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
  set(found "")
  foreach(dir IN LISTS dirs)
    if(EXISTS "${dir}/${header}")
      set(found "${dir}")
    endif()
  endforeach()
  if(NOT found MATCHES "^${VENDOR_PREFIX}/")
    message(FATAL_ERROR "${target}: ${header} not found in the prefix (include dirs: ${dirs})")
  endif()
  message(STATUS "${target}: ${found}")
endforeach()
foreach(dir Eigen3_DIR doctest_DIR CLI11_DIR)
  if(NOT ${dir} MATCHES "^${VENDOR_PREFIX}/")
    message(FATAL_ERROR "${dir} = ${${dir}} is outside the prefix")
  endif()
endforeach()
EOF
cmake -S "$check" -B "$check/build" -DCMAKE_PREFIX_PATH="$prefix" -DVENDOR_PREFIX="$prefix" \
  -DCMAKE_POLICY_VERSION_MINIMUM=3.5 >"$check/log" 2>&1 || { cat "$check/log" >&2; exit 1; }
grep -- '-- .*::' "$check/log" || true
echo "vendor_deps: $(du -sh "$prefix" | cut -f1) in $prefix (configs resolve inside it)"
