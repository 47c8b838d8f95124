# Runs Doxygen and fails on any warning: cmake -D DOXYGEN=... -D DOXYFILE=... -D LOG=... -P run_doxygen.cmake
#
# The Doxyfile sends warnings to LOG (WARN_LOGFILE) and sets WARN_AS_ERROR =
# FAIL_ON_WARNINGS; this script prints the log, so the warnings show in the build output,
# and fails when it is not empty, whatever Doxygen's exit code says.
foreach(var DOXYGEN DOXYFILE LOG)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_doxygen.cmake: -D ${var}=... is required")
  endif()
endforeach()

file(REMOVE "${LOG}")
execute_process(COMMAND "${DOXYGEN}" "${DOXYFILE}" RESULT_VARIABLE rc)
set(warnings "")
if(EXISTS "${LOG}")
  file(READ "${LOG}" warnings)
endif()
string(STRIP "${warnings}" warnings)
if(DEFINED NOTES AND DEFINED REPO)
  # A note's converted copy has the note's line numbers: name the note itself.
  string(REPLACE "${NOTES}" "${REPO}" warnings "${warnings}")
endif()
if(NOT warnings STREQUAL "")
  message("${warnings}")
  string(REGEX MATCHALL "\n" lines "${warnings}\n")
  list(LENGTH lines count)
  message(FATAL_ERROR "docs: Doxygen reported ${count} warning line(s) (listed above); "
                      "warnings are errors. The full log is ${LOG}")
endif()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "docs: doxygen exited with ${rc}")
endif()
message(STATUS "docs: Doxygen finished with zero warnings")
