# specdec::compiled: specdec with its hot core compiled once (compiled mode). Linking it defines
# SPECDEC_COMPILED for the user's translation units, which then only declare the core (the
# instruction-set copies of the sampling and verification cores, and tree verification); its one
# source file, specdec_core.cpp, defines them, compiled in the user's own build with the user's
# compiler and flags. Header-only use (specdec::specdec) stays the default.
#
#   specdec_add_compiled_target(<path of specdec_core.cpp>)
#
# Used by specdec's own CMakeLists.txt (add_subdirectory, FetchContent) and by its installed
# package configuration (find_package), so the package stays architecture-independent. The
# static library is built only when something links it.
function(specdec_add_compiled_target source)
  if(TARGET specdec_compiled)
    return()
  endif()
  add_library(specdec_compiled STATIC EXCLUDE_FROM_ALL "${source}")
  add_library(specdec::compiled ALIAS specdec_compiled)
  target_link_libraries(specdec_compiled PUBLIC specdec::specdec)
  target_compile_definitions(specdec_compiled PUBLIC SPECDEC_COMPILED)
  target_compile_features(specdec_compiled PUBLIC cxx_std_20)
  set_target_properties(specdec_compiled PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()
