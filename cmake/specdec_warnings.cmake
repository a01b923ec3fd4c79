# Warnings for the project's own tests, examples and benchmarks (never for consumers
# of the library target).
add_library(specdec_warnings INTERFACE)
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(specdec_warnings INTERFACE -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wsign-conversion)
  if(SPECDEC_WERROR)
    target_compile_options(specdec_warnings INTERFACE -Werror)
  endif()
elseif(MSVC)
  target_compile_options(specdec_warnings INTERFACE /W4 $<$<BOOL:${SPECDEC_WERROR}>:/WX>)
endif()
