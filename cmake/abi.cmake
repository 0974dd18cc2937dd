# ABI surface of the replacement libraries: version scripts, the "unsupported" entry points and
# the stub libmlx5/libefa that perftest needs.
#
# Included from the top-level CMakeLists.txt after the SHARED targets `ibverbs` and `rdmacm` are
# defined and SV_LIB_DIR is set. The version scripts reproduce the version nodes and parent
# chains of Debian 12's libibverbs.so.1 / librdmacm.so.1 / libmlx5.so.1 / libefa.so.1;
# tests/tools/abi_exports.sh checks them against the system libraries.

foreach(_sv_target ibverbs rdmacm)
  if(NOT TARGET ${_sv_target})
    message(FATAL_ERROR "cmake/abi.cmake: target '${_sv_target}' must be defined before inclusion")
  endif()
endforeach()
if(NOT DEFINED SV_LIB_DIR)
  message(FATAL_ERROR "cmake/abi.cmake: SV_LIB_DIR must be set before inclusion")
endif()

get_filename_component(_sv_root ${CMAKE_CURRENT_LIST_DIR}/.. ABSOLUTE)
set(SV_IBVERBS_MAP ${_sv_root}/src/verbs/libibverbs.map)
set(SV_RDMACM_MAP ${_sv_root}/src/rdmacm/librdmacm.map)
set(SV_MLX5_MAP ${_sv_root}/src/stubs/libmlx5.map)
set(SV_EFA_MAP ${_sv_root}/src/stubs/libefa.map)

# Attach a GNU ld version script to a shared library and relink when the script changes.
function(sv_use_version_script target map)
  target_link_options(${target} PRIVATE -Wl,--version-script=${map})
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${map})
endfunction()

# libibverbs.so.1 / librdmacm.so.1: entry points not backed by the engine.
target_sources(ibverbs PRIVATE ${_sv_root}/src/verbs/unsupported.cc)
target_sources(rdmacm PRIVATE ${_sv_root}/src/rdmacm/unsupported.cc)
sv_use_version_script(ibverbs ${SV_IBVERBS_MAP})
sv_use_version_script(rdmacm ${SV_RDMACM_MAP})

# Stub libmlx5.so.1 / libefa.so.1. Every perftest binary has DT_NEEDED on both. The real ones
# are providers for the system libibverbs and need its IBVERBS_PRIVATE_34 internals, so these
# stubs, placed next to our libibverbs.so.1, keep them from ever being loaded.
function(sv_add_provider_stub target output_name version source map)
  add_library(${target} SHARED ${source})
  set_target_properties(${target} PROPERTIES
    OUTPUT_NAME ${output_name}
    SOVERSION 1
    VERSION ${version}
    C_VISIBILITY_PRESET hidden
    LIBRARY_OUTPUT_DIRECTORY ${SV_LIB_DIR})
  target_link_options(${target} PRIVATE -Wl,-z,now -Wl,--no-undefined)
  sv_use_version_script(${target} ${map})
endfunction()

sv_add_provider_stub(mlx5_stub mlx5 1.24.0 ${_sv_root}/src/stubs/mlx5_stub.c
                     ${SV_MLX5_MAP})
sv_add_provider_stub(efa_stub efa 1.2.0 ${_sv_root}/src/stubs/efa_stub.c
                     ${SV_EFA_MAP})
