# Builds and runs a consumer project of specdec (run with cmake -P).
#   MODE=find_package:     install the build in SPECDEC_BINARY_DIR into a temporary prefix,
#                          then configure the consumer with CMAKE_PREFIX_PATH pointing at it.
#   MODE=add_subdirectory: configure the consumer with SPECDEC_SOURCE_DIR as a subdirectory.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}")
  endif()
endfunction()

set(consumer "${SPECDEC_SOURCE_DIR}/tests/packaging/${MODE}")
if(MODE STREQUAL "find_package")
  run("${CMAKE_COMMAND}" --install "${SPECDEC_BINARY_DIR}" --prefix "${WORK_DIR}/prefix")
  run("${CMAKE_COMMAND}" -S "${consumer}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
      "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" -DCMAKE_BUILD_TYPE=Release)
else()
  run("${CMAKE_COMMAND}" -S "${consumer}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
      "-DSPECDEC_SOURCE_DIR=${SPECDEC_SOURCE_DIR}" -DCMAKE_BUILD_TYPE=Release)
endif()
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer")
