# Driver of the odr.link_order test: runs the battery program linked in both orders (AB: TU a's
# object first, BA: TU b's object first) and fails unless
#   1. TU a's results are the same in both link orders,
#   2. TU b's results are the same in both link orders,
#   3. TU a's and TU b's results agree bit for bit (in each program),
# naming every item that differs.
# Usage: cmake -DAB=<program linked a, b> -DBA=<program linked b, a> -P compare.cmake

if(NOT DEFINED AB OR NOT DEFINED BA)
  message(FATAL_ERROR "usage: cmake -DAB=<program> -DBA=<program> -P compare.cmake")
endif()

foreach(_order AB BA)
  execute_process(COMMAND "${${_order}}" RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${_order}: ${${_order}} failed (${_rc})\n${_out}${_err}")
  endif()
  set(${_order}_names "")
  set(${_order}_a "")
  set(${_order}_b "")
  set(${_order}_diff "")
  string(REPLACE "\n" ";" _lines "${_out}")
  foreach(_line IN LISTS _lines)
    if(_line MATCHES "^item ([^ ]+) n=[0-9]+ a=([0-9a-f]+) b=([0-9a-f]+) ?(.*)$")
      list(APPEND ${_order}_names "${CMAKE_MATCH_1}")
      list(APPEND ${_order}_a "${CMAKE_MATCH_2}")
      list(APPEND ${_order}_b "${CMAKE_MATCH_3}")
      list(APPEND ${_order}_diff "-${CMAKE_MATCH_4}")  # "-" keeps an empty entry in the list
    elseif(_line MATCHES "^(tu|total) ")
      message(STATUS "${_order}: ${_line}")
    elseif(NOT _line STREQUAL "")
      message(FATAL_ERROR "${_order}: unexpected output: ${_line}")
    endif()
  endforeach()
endforeach()

list(LENGTH AB_names _count)
if(_count EQUAL 0 OR NOT AB_names STREQUAL BA_names)
  message(FATAL_ERROR "the two programs do not run the same battery")
endif()

set(_report_lines "")
set(_n_a 0)
set(_n_b 0)
set(_n_split 0)
math(EXPR _last "${_count} - 1")
foreach(_k RANGE ${_last})
  foreach(_v a b diff)
    list(GET AB_${_v} ${_k} _ab_${_v})
    list(GET BA_${_v} ${_k} _ba_${_v})
  endforeach()
  set(_why "")
  if(NOT _ab_a STREQUAL _ba_a)
    string(APPEND _why " 1")
    math(EXPR _n_a "${_n_a} + 1")
  endif()
  if(NOT _ab_b STREQUAL _ba_b)
    string(APPEND _why " 2")
    math(EXPR _n_b "${_n_b} + 1")
  endif()
  if(NOT _ab_a STREQUAL _ab_b OR NOT _ba_a STREQUAL _ba_b)
    string(APPEND _why " 3")
    math(EXPR _n_split "${_n_split} + 1")
    foreach(_order ab ba)
      string(SUBSTRING "${_${_order}_diff}" 1 -1 _first)
      if(NOT _first STREQUAL "")
        string(TOUPPER "${_order}" _upper)
        string(APPEND _why " (${_upper} ${_first})")
      endif()
    endforeach()
  endif()
  if(NOT _why STREQUAL "")
    list(GET AB_names ${_k} _name)
    string(APPEND _report_lines "\n  ${_name}:${_why}")
  endif()
endforeach()

if(NOT _report_lines STREQUAL "")
  message(FATAL_ERROR "specdec's results depend on the translation units' flags or on the link order "
    "(AB: TU a's object first, BA: TU b's first):\n"
    "  1. TU a's results differ between AB and BA in ${_n_a} of ${_count} items\n"
    "  2. TU b's results differ between AB and BA in ${_n_b} of ${_count} items\n"
    "  3. TU a and TU b disagree in ${_n_split} of ${_count} items\n"
    "The items that differ, with the conditions they break:${_report_lines}\n"
    "To see every word: run both programs with --words and compare the outputs.")
endif()
message(STATUS "all ${_count} items identical in both translation units and both link orders")
