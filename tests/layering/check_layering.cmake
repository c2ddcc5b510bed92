# cmake -DSOURCE_DIR=... -DBINARY_DIR=... [-DCUDA_LIBRARY=... -DNM=...] -P check_layering.cmake
# The layering rule, at test time:
#   1. no file under optimized/ or harness/spec/ includes a hybridtb/reference/ header;
#   2. the tools (harness/cli, harness/src, datasets, experiments) include none either, except the one
#      place that registers the concrete backends (harness/src/builtin_backends.cpp);
#   3. the link closures recorded at configure time (harness/spec/layering.cmake): hybridtb_cuda
#      reaches no hybridtb_reference* target, hybridtb_spec neither that nor hybridtb_cuda;
#   4. where the CUDA library was built and nm is there: it has no undefined symbol of namespace
#      hybridtb::reference (so nothing of the reference is called, whatever the build files say).
# Exits non-zero naming every violation.
cmake_policy(VERSION 3.24)
set(violations "")

function(check_includes dir allowed)
  file(GLOB_RECURSE files LIST_DIRECTORIES false
       "${SOURCE_DIR}/${dir}/*.h" "${SOURCE_DIR}/${dir}/*.hpp" "${SOURCE_DIR}/${dir}/*.cpp"
       "${SOURCE_DIR}/${dir}/*.cu" "${SOURCE_DIR}/${dir}/*.cuh")
  foreach(file IN LISTS files)
    file(RELATIVE_PATH relative "${SOURCE_DIR}" "${file}")
    if(relative IN_LIST allowed)
      continue()
    endif()
    file(STRINGS "${file}" hits REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]hybridtb/reference/")
    foreach(hit IN LISTS hits)
      list(APPEND violations "${relative}: ${hit}")
    endforeach()
  endforeach()
  set(violations "${violations}" PARENT_SCOPE)
endfunction()

check_includes(optimized "")
check_includes(harness/spec "")
check_includes(harness/cli "")
check_includes(harness/src "harness/src/builtin_backends.cpp")
check_includes(harness/include "")
check_includes(datasets "")
check_includes(experiments "")

foreach(pair "hybridtb_cuda=^hybridtb_reference" "hybridtb_spec=^hybridtb_(reference|cuda)")
  string(REGEX REPLACE "=.*$" "" target "${pair}")
  string(REGEX REPLACE "^[^=]*=" "" forbidden "${pair}")
  set(links_file "${BINARY_DIR}/layering/${target}.links")
  if(NOT EXISTS "${links_file}")
    if(target STREQUAL "hybridtb_cuda")
      continue()  # a build without CUDA
    endif()
    list(APPEND violations "${links_file}: missing (configure with harness/spec/layering.cmake)")
    continue()
  endif()
  file(STRINGS "${links_file}" links)
  foreach(link IN LISTS links)
    if(link MATCHES "${forbidden}")
      list(APPEND violations "${target} links ${link}")
    endif()
  endforeach()
endforeach()

if(CUDA_LIBRARY AND EXISTS "${CUDA_LIBRARY}" AND NM)
  execute_process(COMMAND "${NM}" -C --undefined-only "${CUDA_LIBRARY}" OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    list(APPEND violations "${NM} failed on ${CUDA_LIBRARY}")
  else()
    string(REGEX MATCHALL "[^\n]*hybridtb::reference::[^\n]*" used "${symbols}")
    foreach(symbol IN LISTS used)
      list(APPEND violations "${CUDA_LIBRARY} uses ${symbol}")
    endforeach()
  endif()
endif()

if(violations)
  list(JOIN violations "\n  " text)
  message(FATAL_ERROR "layering violations:\n  ${text}")
endif()
message(STATUS "layering: optimized/ and harness/spec/ include no reference header; the tools reach the "
               "backends through the registry; hybridtb_cuda links no reference target")
