# The layers of docs/architecture.md, lowest first, in one table that the build reads twice:
# - CMakeLists.txt includes this file for the table: each folder is one static library that links
#   exactly the libraries of the folders in its row (layup_layer_libraries below), so a call into
#   a folder the row does not name fails the link.
# - Run as a script (by the layup_layer_check target on every build) it fails when a source file
#   under SOURCE_DIR/src includes a header of a layer above its own, of another folder of its own
#   layer, or of a lower folder its row does not name, and when a row names a folder that none of
#   that folder's sources include. Tests (*_test.*, *_test_support.h) may include any layer: they
#   pin how the layers work together.
#   cmake -DSOURCE_DIR=<repository> -P scripts/check_layers.cmake
# It reads every include form: #include "x.h" (found beside the including file, so in its own
# folder), #include "a/b.h" (beside the including file, else under src/), #include <a/b.h> where
# a is a folder under src/ (other angle includes, the system's and third-party headers, are not
# layup's), and any spacing around the # ("  #  include").
if(CMAKE_SCRIPT_MODE_FILE)
  cmake_minimum_required(VERSION 3.20)
endif()

# layup_define_layer(folder rank [folders it includes...]): a file may include its own folder and
# the folders of its row, each of a lower rank; the folder's library links exactly those.
set(layup_layers "")
macro(layup_define_layer folder rank)
  list(APPEND layup_layers ${folder})
  set(layup_rank_${folder} ${rank})
  set(layup_uses_${folder} ${ARGN})
endmacro()

#                  folder        rank  the folders it includes (and links)
layup_define_layer(core            0)  # headers only: the error type, the run's choices, the RNG
layup_define_layer(model           1  core)
layup_define_layer(tokenizer       1  core)
layup_define_layer(energy          1  core)
layup_define_layer(io              2  core model)
layup_define_layer(optim           2  core model)
layup_define_layer(trace           3  core io)
layup_define_layer(data            3  core io model tokenizer)
layup_define_layer(memory          4  core io model)
# the interface (Device, ModelBackend); where optimizer state lives beyond memory (the disk tier's
# file); the ranks of a data-parallel run and their collectives
layup_define_layer(backend         5  core model optim memory)
layup_define_layer(tier            5  core memory)
layup_define_layer(comm            5  core)
# the backend implementations
layup_define_layer(backend/cpu     6  core model optim memory backend)
layup_define_layer(backend/cuda    6  core model optim memory backend)
layup_define_layer(schedule        7  core model optim trace memory backend tier comm)
# the composition root: picks a backend, plans, builds a run
layup_define_layer(engine          8  core model io optim memory backend tier backend/cpu
                                      backend/cuda schedule)
layup_define_layer(sample          9  core model memory backend backend/cpu backend/cuda)
layup_define_layer(train          10  core model tokenizer energy io optim trace data memory
                                      tier comm schedule engine sample)
layup_define_layer(study          11  core io memory engine train)
layup_define_layer(cli            12  core model tokenizer io optim data memory backend tier comm
                                      backend/cuda engine sample train study)

# The layer folder of a path relative to src/ ("backend/cuda/ops/matmul.cu" -> "backend/cuda").
function(layup_layer_folder path out)
  string(REGEX MATCH "^backend/(cpu|cuda)/" implementation "${path}")
  if(implementation)
    string(REGEX REPLACE "/$" "" folder "${implementation}")
  else()
    string(REGEX MATCH "^[^/]+" folder "${path}")
  endif()
  set(${out} "${folder}" PARENT_SCOPE)
endfunction()

# The CMake library of a layer folder: layup_core (an interface library), layup_backend_cpu,
# layup_backend_cuda_host (the CUDA backend's plain C++; its kernels, layup_cuda, link it), or
# layup_<folder>.
function(layup_layer_library folder out)
  if(folder STREQUAL "backend/cuda")
    set(${out} layup_backend_cuda_host PARENT_SCOPE)
  else()
    string(REPLACE "/" "_" name "${folder}")
    set(${out} layup_${name} PARENT_SCOPE)
  endif()
endfunction()

# The libraries the library of `folder` links: those of the folders in its row.
function(layup_layer_libraries folder out)
  set(libraries "")
  foreach(used ${layup_uses_${folder}})
    layup_layer_library(${used} library)
    list(APPEND libraries ${library})
  endforeach()
  set(${out} ${libraries} PARENT_SCOPE)
endfunction()

# Every folder a row names has a rank, and a lower one than the row's: the links point down.
function(layup_check_layer_table out)
  set(wrong "")
  foreach(folder ${layup_layers})
    foreach(used ${layup_uses_${folder}})
      if(NOT DEFINED layup_rank_${used})
        string(APPEND wrong "\n  the row of '${folder}' names '${used}', which has no layer")
      elseif(NOT layup_rank_${used} LESS layup_rank_${folder})
        string(APPEND wrong "\n  the row of '${folder}' (layer ${layup_rank_${folder}}) names "
                            "'${used}' (layer ${layup_rank_${used}}): a link up or across")
      endif()
    endforeach()
  endforeach()
  set(${out} "${wrong}" PARENT_SCOPE)
endfunction()

if(NOT CMAKE_SCRIPT_MODE_FILE)
  return()  # included by CMakeLists.txt: the table and the functions above are all it takes
endif()

layup_check_layer_table(wrong)
set(src "${SOURCE_DIR}/src")
file(GLOB_RECURSE sources RELATIVE "${src}" "${src}/*.h" "${src}/*.cpp" "${src}/*.cu" "${src}/*.cuh")
set(folders_with_sources "")
foreach(source ${sources})
  if(source MATCHES "_test\\.[a-z]+$" OR source MATCHES "_test_support\\.h$")
    continue()
  endif()
  layup_layer_folder("${source}" from)
  if(NOT DEFINED layup_rank_${from})
    string(APPEND wrong "\n  ${source}: its folder '${from}' has no layer in scripts/check_layers.cmake")
    continue()
  endif()
  list(APPEND folders_with_sources ${from})
  get_filename_component(source_dir "${source}" DIRECTORY)
  file(STRINGS "${src}/${source}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<][^\">]+[\">]")
  foreach(line ${includes})
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*([\"<])([^\">]+)[\">].*" "\\1;\\2" parsed
           "${line}")
    list(GET parsed 0 form)
    list(GET parsed 1 header)
    # Where the compiler finds it, as a path relative to src/. A quoted include is looked for
    # beside the including file first, then on the include path (src/, and build/generated/
    # for the generated build_commit.h, which is in no src/ folder: not layup's layers, skipped).
    # An angle include is looked for on the include path only: a first component that is no
    # folder of src/ (<vector>, <Eigen/Core>, <nlohmann/json.hpp>) is the system's or a
    # third-party header, skipped.
    set(resolved "")
    if(form STREQUAL "\"" AND EXISTS "${src}/${source_dir}/${header}")
      cmake_path(SET resolved NORMALIZE "${source_dir}/${header}")
      if(resolved MATCHES "^\\.\\./")
        continue()  # beside the file but outside src/
      endif()
    else()
      string(REGEX MATCH "^[^/]+/" top "${header}")
      if(top AND IS_DIRECTORY "${src}/${top}")
        set(resolved "${header}")
      endif()
    endif()
    if(NOT resolved)
      continue()
    endif()
    layup_layer_folder("${resolved}" to)
    if(to STREQUAL from)
      continue()
    endif()
    if(form STREQUAL "<")
      set(written "<${header}>")
    else()
      set(written "\"${header}\"")
    endif()
    if(NOT DEFINED layup_rank_${to})
      continue()  # a folder without a layer: its own sources are reported
    endif()
    if(NOT layup_rank_${to} LESS layup_rank_${from})
      string(APPEND wrong "\n  src/${source} (${from}, layer ${layup_rank_${from}}) includes "
                          "${resolved} (${to}, layer ${layup_rank_${to}}) as #include ${written}")
    elseif(NOT to IN_LIST layup_uses_${from})
      string(APPEND wrong "\n  src/${source} (${from}) includes ${resolved} (${to}) as #include "
                          "${written}, but the row of '${from}' in scripts/check_layers.cmake does "
                          "not name '${to}' (its library would not link it)")
    endif()
    list(APPEND used_by_${from} ${to})
  endforeach()
endforeach()
# Each row names exactly what its folder includes: a library links no layer it does not use.
list(REMOVE_DUPLICATES folders_with_sources)
foreach(folder ${folders_with_sources})
  foreach(used ${layup_uses_${folder}})
    if(NOT used IN_LIST used_by_${folder})
      string(APPEND wrong "\n  the row of '${folder}' in scripts/check_layers.cmake names '${used}', "
                          "which no source of src/${folder}/ includes (its library would link it)")
    endif()
  endforeach()
endforeach()
if(wrong)
  message(FATAL_ERROR "the layers of docs/architecture.md are not kept:${wrong}")
endif()
