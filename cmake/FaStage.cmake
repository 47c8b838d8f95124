# fa_add_stage(<sources>...)
#
# Called from a stage folder's one-line CMakeLists.txt. For stages/05_one_pass_fused it makes
#   - fa_stage_05: a static library with the stage's sources and register.cpp
#   - stage05:     the stage program (main.cpp → fa::run_stage_cli)
# and appends the library to the global FA_STAGE_LIBS list used by the tour and the C ABI.
function(fa_add_stage)
  get_filename_component(folder "${CMAKE_CURRENT_SOURCE_DIR}" NAME)
  string(SUBSTRING "${folder}" 0 2 number)
  set(lib fa_stage_${number})
  add_library(${lib} STATIC ${ARGN} register.cpp)
  target_include_directories(${lib} PUBLIC "${CMAKE_CURRENT_SOURCE_DIR}")
  target_link_libraries(${lib} PUBLIC fa_common PRIVATE fa_warnings)
  add_executable(stage${number} main.cpp)
  target_link_libraries(stage${number} PRIVATE ${lib} fa_warnings)
  set_property(GLOBAL APPEND PROPERTY FA_STAGE_LIBS ${lib})
endfunction()
