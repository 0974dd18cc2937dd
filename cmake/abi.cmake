# ABI surface of the replacement libraries: version scripts and the "unsupported" entry points.
# No provider stubs: Debian's libmlx5.so.1/libefa.so.1 load against our libibverbs (they import
# IBVERBS_PRIVATE_34 internals we define) and answer "not supported" for our device, so
# perftest, UCX's libuct_ib and pyverbs' mlx5dv/efadv all load (tests/tools/abi_exports.sh).
#
# Included from the top-level CMakeLists.txt after the SHARED targets `ibverbs` and `rdmacm` are
# defined and SV_LIB_DIR is set. The version scripts reproduce the version nodes and parent
# chains of Debian 12's libibverbs.so.1 / librdmacm.so.1;
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

# Attach a GNU ld version script to a shared library and relink when the script changes.
function(sv_use_version_script target map)
  target_link_options(${target} PRIVATE -Wl,--version-script=${map})
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${map})
endfunction()

# libibverbs.so.1: entry points not backed by the engine.
target_sources(ibverbs PRIVATE ${_sv_root}/src/verbs/unsupported.cc)
sv_use_version_script(ibverbs ${SV_IBVERBS_MAP})
sv_use_version_script(rdmacm ${SV_RDMACM_MAP})
