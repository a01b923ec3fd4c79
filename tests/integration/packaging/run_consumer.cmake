# Builds and runs a consumer project of specdec (run with cmake -P).
#   MODE=find_package:     install the build in SPECDEC_BINARY_DIR into a temporary prefix,
#                          check that it holds every file of the source's include/ (headers and
#                          detail/*.inc fragments), then configure the consumer with
#                          CMAKE_PREFIX_PATH pointing at it.
#   MODE=add_subdirectory: configure the consumer with SPECDEC_SOURCE_DIR as a subdirectory.
#   MODE=precompiled_header: the same, with <specdec/specdec.hpp> precompiled for the consumer
#                          (target_precompile_headers); the build must have made the PCH.
#   MODE=fetchcontent:     a consumer that declares specdec with FetchContent, pointed at
#                          SPECDEC_SOURCE_DIR through FETCHCONTENT_SOURCE_DIR_SPECDEC (no download).
#   MODE=pkg_config:       install as find_package does, check that `pkg-config --cflags specdec`
#                          gives the prefix's include folder and Eigen's, and build the consumer
#                          twice through the .pc file: by hand (CXX with those flags) and with
#                          CMake's pkg_check_modules.
#   MODE=deb:              configure SPECDEC_SOURCE_DIR alone (no tests, examples, benchmarks),
#                          run `cpack -G DEB`, check the package's fields and contents, unpack it
#                          into a temporary root and build the consumer from there with
#                          find_package and with pkg-config (by hand).
# WORK_DIR is emptied first; GENERATOR, CXX (the compiler for the by-hand build) and CPACK
# (the cpack program) are passed by the test.
# The consumers are built unoptimized (no build type): they check that the library is found and
# works, not its speed, and an optimized build of the hot core's copies takes twice as long.
set(CONSUMER_BUILD_TYPE "")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}")
  endif()
endfunction()
# capture(<var> <command>...): runs the command and sets <var> to its standard output.
function(capture var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}${err}")
  endif()
  set(${var} "${out}" PARENT_SCOPE)
endfunction()
function(expect_contains what text needle)
  string(FIND "${text}" "${needle}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${what}: expected to contain '${needle}', got:\n${text}")
  endif()
endfunction()

# Builds and runs the consumer through specdec's .pc file in PC_DIR; extra arguments go to
# pkg-config (e.g. --define-prefix). INCLUDE_DIR: where the headers must be found. WITH_CMAKE:
# also build it through CMake's FindPkgConfig.
function(build_with_pkg_config pc_dir include_dir with_cmake)
  find_program(PKG_CONFIG_EXECUTABLE NAMES pkg-config pkgconf REQUIRED)
  set(pc ${CMAKE_COMMAND} -E env "PKG_CONFIG_PATH=${pc_dir}" "${PKG_CONFIG_EXECUTABLE}" ${ARGN})
  capture(version ${pc} --modversion specdec)
  message(STATUS "pkg-config: specdec ${version}")
  capture(cflags ${pc} --cflags specdec)
  message(STATUS "pkg-config --cflags specdec: ${cflags}")
  expect_contains("pkg-config --cflags specdec" "${cflags}" "-I${include_dir}")
  capture(eigen_cflags ${pc} --cflags eigen3)
  expect_contains("pkg-config --cflags specdec (Eigen's flags through Requires: eigen3)" "${cflags}" "${eigen_cflags}")
  separate_arguments(cflag_list UNIX_COMMAND "${cflags}")
  run("${CXX}" -std=c++20 ${cflag_list} "${SPECDEC_SOURCE_DIR}/tests/integration/packaging/consumer.cpp"
      -o "${WORK_DIR}/consumer_by_hand")
  run("${WORK_DIR}/consumer_by_hand")
  if(NOT with_cmake)
    return()
  endif()
  # The same through CMake's FindPkgConfig (which passes the extra arguments on only through
  # PKG_CONFIG_ARGN).
  run(${CMAKE_COMMAND} -E env "PKG_CONFIG_PATH=${pc_dir}"
      "${CMAKE_COMMAND}" -S "${SPECDEC_SOURCE_DIR}/tests/integration/packaging/pkg_config" -B "${WORK_DIR}/build_pkg_config"
      -G "${GENERATOR}" "-DCMAKE_BUILD_TYPE=${CONSUMER_BUILD_TYPE}" "-DPKG_CONFIG_ARGN=${ARGN}")
  run("${CMAKE_COMMAND}" --build "${WORK_DIR}/build_pkg_config")
  run("${WORK_DIR}/build_pkg_config/consumer")
endfunction()

set(consumer "${SPECDEC_SOURCE_DIR}/tests/integration/packaging/find_package")
if(MODE STREQUAL "find_package")
  run("${CMAKE_COMMAND}" --install "${SPECDEC_BINARY_DIR}" --prefix "${WORK_DIR}/prefix")
  # Every file of the source tree's include/ is installed: the headers (*.hpp) and the
  # fragments of the per-instruction-set core (detail/*.inc), which they include.
  file(GLOB_RECURSE source_files RELATIVE "${SPECDEC_SOURCE_DIR}/include" "${SPECDEC_SOURCE_DIR}/include/*")
  file(GLOB_RECURSE installed_files RELATIVE "${WORK_DIR}/prefix/include" "${WORK_DIR}/prefix/include/*")
  list(SORT source_files)
  list(SORT installed_files)
  if(NOT source_files STREQUAL installed_files)
    message(FATAL_ERROR "the install's include/ differs from the source tree's:\n"
                        "source: ${source_files}\ninstalled: ${installed_files}")
  endif()
  list(FILTER installed_files INCLUDE REGEX "^specdec/detail/.*[.]inc$")
  if(NOT installed_files)
    message(FATAL_ERROR "the install has no fragments (specdec/detail/*.inc)")
  endif()
  run("${CMAKE_COMMAND}" -S "${consumer}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
      "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" "-DCMAKE_BUILD_TYPE=${CONSUMER_BUILD_TYPE}")
elseif(MODE STREQUAL "add_subdirectory")
  run("${CMAKE_COMMAND}" -S "${SPECDEC_SOURCE_DIR}/tests/integration/packaging/add_subdirectory" -B "${WORK_DIR}/build"
      -G "${GENERATOR}" "-DSPECDEC_SOURCE_DIR=${SPECDEC_SOURCE_DIR}" "-DCMAKE_BUILD_TYPE=${CONSUMER_BUILD_TYPE}")
elseif(MODE STREQUAL "precompiled_header")
  run("${CMAKE_COMMAND}" -S "${SPECDEC_SOURCE_DIR}/tests/integration/packaging/precompiled_header" -B "${WORK_DIR}/build"
      -G "${GENERATOR}" "-DSPECDEC_SOURCE_DIR=${SPECDEC_SOURCE_DIR}" "-DCMAKE_BUILD_TYPE=${CONSUMER_BUILD_TYPE}")
elseif(MODE STREQUAL "fetchcontent")
  run("${CMAKE_COMMAND}" -S "${SPECDEC_SOURCE_DIR}/tests/integration/packaging/fetchcontent" -B "${WORK_DIR}/build"
      -G "${GENERATOR}" "-DFETCHCONTENT_SOURCE_DIR_SPECDEC=${SPECDEC_SOURCE_DIR}" "-DCMAKE_BUILD_TYPE=${CONSUMER_BUILD_TYPE}")
elseif(MODE STREQUAL "pkg_config")
  run("${CMAKE_COMMAND}" --install "${SPECDEC_BINARY_DIR}" --prefix "${WORK_DIR}/prefix")
  if(NOT EXISTS "${WORK_DIR}/prefix/share/pkgconfig/specdec.pc")
    message(FATAL_ERROR "the install has no share/pkgconfig/specdec.pc")
  endif()
  build_with_pkg_config("${WORK_DIR}/prefix/share/pkgconfig" "${WORK_DIR}/prefix/include" ON)
  return()
elseif(MODE STREQUAL "deb")
  run("${CMAKE_COMMAND}" -S "${SPECDEC_SOURCE_DIR}" -B "${WORK_DIR}/specdec" -G "${GENERATOR}"
      -DSPECDEC_BUILD_TESTS=OFF -DSPECDEC_BUILD_EXAMPLES=OFF -DSPECDEC_BUILD_BENCHMARKS=OFF)
  execute_process(COMMAND "${CPACK}" -G DEB -B "${WORK_DIR}/deb" WORKING_DIRECTORY "${WORK_DIR}/specdec"
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "cpack -G DEB failed (${rc})")
  endif()
  file(GLOB debs "${WORK_DIR}/deb/*.deb")
  list(LENGTH debs n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "cpack -G DEB made ${n} .deb files in ${WORK_DIR}/deb, expected 1: ${debs}")
  endif()
  message(STATUS "package: ${debs}")
  find_program(DPKG_DEB dpkg-deb REQUIRED)
  capture(package "${DPKG_DEB}" --field "${debs}" Package)
  capture(depends "${DPKG_DEB}" --field "${debs}" Depends)
  capture(arch "${DPKG_DEB}" --field "${debs}" Architecture)
  message(STATUS "Package: ${package}; Depends: ${depends}; Architecture: ${arch}")
  expect_contains("the package's name" "${package}" "libspecdec-dev")
  expect_contains("the package's Depends" "${depends}" "libeigen3-dev")
  expect_contains("the package's Architecture" "${arch}" "all")
  capture(contents "${DPKG_DEB}" --contents "${debs}")
  foreach(f ./usr/include/specdec/specdec.hpp ./usr/include/specdec/version.hpp
            ./usr/include/specdec/detail/for_each_isa.inc ./usr/include/specdec/detail/instance_verify.inc
            ./usr/share/cmake/specdec/specdecConfig.cmake ./usr/share/cmake/specdec/specdecTargets.cmake
            ./usr/share/cmake/specdec/specdec_compiled.cmake ./usr/share/cmake/specdec/specdec_core.cpp
            ./usr/share/pkgconfig/specdec.pc)
    expect_contains("dpkg-deb --contents" "${contents}" "${f}")
  endforeach()
  run("${DPKG_DEB}" -x "${debs}" "${WORK_DIR}/root")
  file(READ "${WORK_DIR}/root/usr/share/pkgconfig/specdec.pc" pc_text)
  expect_contains("the packaged specdec.pc" "${pc_text}" "prefix=/usr\n")
  # The unpacked tree stands in for /usr: pkg-config takes each prefix from where its .pc file
  # lies (so specdec's is the unpacked tree, Eigen's stays /usr). By hand only: packaging.pkg_config
  # covers FindPkgConfig, and each build of the consumer takes a while.
  build_with_pkg_config("${WORK_DIR}/root/usr/share/pkgconfig" "${WORK_DIR}/root/usr/include" OFF --define-prefix)
  run("${CMAKE_COMMAND}" -S "${consumer}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
      "-DCMAKE_PREFIX_PATH=${WORK_DIR}/root/usr" "-DCMAKE_BUILD_TYPE=${CONSUMER_BUILD_TYPE}")
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
if(MODE STREQUAL "precompiled_header")
  # CMake names the precompiled header cmake_pch.hxx.gch (GCC) or .pch (Clang).
  file(GLOB_RECURSE pch "${WORK_DIR}/build/CMakeFiles/consumer.dir/cmake_pch.hxx.*ch")
  if(NOT pch)
    message(FATAL_ERROR "no precompiled header was built for the consumer")
  endif()
endif()
run("${WORK_DIR}/build/consumer")
# The consumers that define it: the same program in compiled mode (specdec::compiled).
if(EXISTS "${WORK_DIR}/build/consumer_compiled")
  run("${WORK_DIR}/build/consumer_compiled")
elseif(MODE MATCHES "^(find_package|add_subdirectory|fetchcontent|deb)$")
  message(FATAL_ERROR "no consumer_compiled was built: specdec::compiled is missing")
endif()
