# Fails when a source file under SOURCE_DIR/src includes a header of a layer above its own, or of
# another folder of its own layer: the layers of docs/architecture.md, lowest first. Tests
# (*_test.*) may include any layer: they pin how the layers work together. Run by the
# layup_layer_check target on every build, so an include that points the wrong way fails it.
#   cmake -DSOURCE_DIR=<repository> -P scripts/check_layers.cmake
cmake_minimum_required(VERSION 3.18)

# folder -> rank. A file may include its own folder and folders of a lower rank.
set(layer_core 0)
set(layer_model 1)
set(layer_tokenizer 1)
set(layer_energy 1)
set(layer_io 2)
set(layer_optim 2)
set(layer_trace 3)
set(layer_data 3)
set(layer_memory 4)
set(layer_backend 5)            # the interface: Device, ModelBackend
set(layer_tier 5)               # where optimizer state lives beyond memory: the disk tier's file
set(layer_comm 5)               # the ranks of a data-parallel run and their collectives
set(layer_backend/cpu 6)        # the implementations
set(layer_backend/cuda 6)
set(layer_schedule 7)
set(layer_engine 8)             # the composition root: picks a backend, plans, builds a run
set(layer_sample 9)
set(layer_train 10)
set(layer_study 11)
set(layer_cli 12)

# The layer folder of a path relative to src/ ("backend/cuda/ops/matmul.cu" -> "backend/cuda").
function(layer_folder path out)
  string(REGEX MATCH "^backend/(cpu|cuda)/" implementation "${path}")
  if(implementation)
    string(REGEX REPLACE "/$" "" folder "${implementation}")
  else()
    string(REGEX MATCH "^[^/]+" folder "${path}")
  endif()
  set(${out} "${folder}" PARENT_SCOPE)
endfunction()

file(GLOB_RECURSE sources RELATIVE "${SOURCE_DIR}/src" "${SOURCE_DIR}/src/*.h"
     "${SOURCE_DIR}/src/*.cpp" "${SOURCE_DIR}/src/*.cu" "${SOURCE_DIR}/src/*.cuh")
set(wrong "")
foreach(source ${sources})
  if(source MATCHES "_test\\.[a-z]+$" OR source MATCHES "_test_support\\.h$")
    continue()
  endif()
  layer_folder("${source}" from)
  if(NOT DEFINED layer_${from})
    string(APPEND wrong "\n  ${source}: its folder '${from}' has no layer in scripts/check_layers.cmake")
    continue()
  endif()
  file(STRINGS "${SOURCE_DIR}/src/${source}" includes REGEX "^#include \"[^\"]+\"")
  foreach(line ${includes})
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" header "${line}")
    if(NOT header MATCHES "/")
      continue()  # generated headers (build_commit.h) and the file's own folder
    endif()
    layer_folder("${header}" to)
    if(to STREQUAL from OR NOT DEFINED layer_${to})
      continue()
    endif()
    if(NOT layer_${to} LESS layer_${from})
      string(APPEND wrong "\n  src/${source} (${from}, layer ${layer_${from}}) includes ${header} "
                          "(${to}, layer ${layer_${to}})")
    endif()
  endforeach()
endforeach()
if(wrong)
  message(FATAL_ERROR "includes that point up or across the layers (docs/architecture.md):${wrong}")
endif()
