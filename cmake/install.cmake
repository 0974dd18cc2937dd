# Install layout (GNUInstallDirs; `cmake --install <build> [--prefix P]`, or the .deb that
# `cpack -G DEB` makes from it):
#   <libdir>/libsvrds.so.0, libsvrds_preload.so     the RDS library and its LD_PRELOAD shim
#   <includedir>/softverbs/rds.h, verbs_ext.h
#   <bindir>/rds-ping rds-info rds-stress blockserver softverbs-stat
#   <bindir>/softverbs-run                           runs an unmodified program on softverbs
#   <bindir>/softverbs-demo                          the demo, from the installed files
#   <libdir>/softverbs/                              libibverbs.so.1, librdmacm.so.1: a private
#       directory, so they never shadow rdma-core's libraries; softverbs-run (or
#       LD_LIBRARY_PATH) selects them for one program. Programs that need libmlx5.so.1 or
#       libefa.so.1 (perftest, UCX, pyverbs) get Debian's, which load against ours.
#   <libdir>/cmake/softverbs/                        find_package(softverbs):
#       softverbs::rds, softverbs::verbs, softverbs::rdmacm
#   <libdir>/pkgconfig/softverbs-rds.pc, softverbs-verbs.pc
# Every installed file finds its neighbours relative to itself ($ORIGIN RUNPATHs, launchers
# and .pc files computed from their own location), so any --prefix works.
# Debian's multiarch library directory (lib/x86_64-linux-gnu), as debhelper sets it, whatever
# the prefix: GNUInstallDirs picks it only for prefix /usr, so a build with the default
# prefix would otherwise package its libraries in /usr/lib. A CMAKE_INSTALL_LIBDIR given on
# the command line wins.
if(NOT DEFINED CMAKE_INSTALL_LIBDIR AND CMAKE_LIBRARY_ARCHITECTURE
   AND EXISTS /etc/debian_version)
  set(CMAKE_INSTALL_LIBDIR lib/${CMAKE_LIBRARY_ARCHITECTURE} CACHE PATH
      "Object code libraries (Debian multiarch)")
endif()
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(SV_PRIVATE_LIBDIR ${CMAKE_INSTALL_LIBDIR}/softverbs)
file(RELATIVE_PATH SV_BIN_TO_LIB /p/${CMAKE_INSTALL_BINDIR} /p/${CMAKE_INSTALL_LIBDIR})
file(RELATIVE_PATH SV_LIB_TO_INCLUDE /p/${CMAKE_INSTALL_LIBDIR} /p/${CMAKE_INSTALL_INCLUDEDIR})

# The ABI libraries find each other in their own directory; libsvrds finds them in the
# private directory (LD_LIBRARY_PATH still wins, e.g. to run RDS over rdma-core instead).
set_target_properties(ibverbs rdmacm PROPERTIES INSTALL_RPATH "$ORIGIN")
set_target_properties(svrds PROPERTIES INSTALL_RPATH "$ORIGIN/softverbs")
set_target_properties(svrds_preload PROPERTIES INSTALL_RPATH "$ORIGIN:$ORIGIN/softverbs")
set(_sv_tools blockserver softverbs-stat)
foreach(tool rds-ping rds-info rds-stress)
  if(TARGET ${tool})
    list(APPEND _sv_tools ${tool})
  endif()
endforeach()
set_target_properties(${_sv_tools} PROPERTIES
  INSTALL_RPATH "$ORIGIN/${SV_BIN_TO_LIB}:$ORIGIN/${SV_BIN_TO_LIB}/softverbs")

set_target_properties(svrds PROPERTIES EXPORT_NAME rds)
set_target_properties(ibverbs PROPERTIES EXPORT_NAME verbs)
set_target_properties(rdmacm PROPERTIES EXPORT_NAME rdmacm)
target_include_directories(svrds PUBLIC $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include>
                                        $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

install(TARGETS svrds svrds_preload EXPORT softverbsTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
        NAMELINK_COMPONENT dev)
install(TARGETS ibverbs rdmacm EXPORT softverbsTargets
        LIBRARY DESTINATION ${SV_PRIVATE_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev)
install(TARGETS ${_sv_tools} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(FILES include/softverbs/rds.h include/softverbs/verbs_ext.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/softverbs
        COMPONENT dev)

configure_file(cmake/templates/softverbs-run.in ${CMAKE_BINARY_DIR}/install/softverbs-run @ONLY)
configure_file(cmake/templates/softverbs-demo.in ${CMAKE_BINARY_DIR}/install/softverbs-demo
               @ONLY)
install(PROGRAMS ${CMAKE_BINARY_DIR}/install/softverbs-run ${CMAKE_BINARY_DIR}/install/softverbs-demo
        DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)

foreach(pc softverbs-rds softverbs-verbs)
  configure_file(cmake/templates/${pc}.pc.in ${CMAKE_BINARY_DIR}/install/${pc}.pc @ONLY)
  install(FILES ${CMAKE_BINARY_DIR}/install/${pc}.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
endforeach()

set(SV_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/softverbs)
install(EXPORT softverbsTargets NAMESPACE softverbs:: DESTINATION ${SV_CMAKE_DIR}
        COMPONENT dev)
configure_package_config_file(cmake/templates/softverbsConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/install/softverbsConfig.cmake
                              INSTALL_DESTINATION ${SV_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/install/softverbsConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/install/softverbsConfig.cmake
              ${CMAKE_BINARY_DIR}/install/softverbsConfigVersion.cmake
        DESTINATION ${SV_CMAKE_DIR} COMPONENT dev)

# A Debian package of all of it (cpack -G DEB in the build tree): it installs beside rdma-core
# (the ABI libraries live in <libdir>/softverbs, not in the loader's path) and needs only
# the Debian libraries our binaries link.
set(CPACK_PACKAGE_NAME softverbs)
set(CPACK_PACKAGE_VENDOR "softverbs")
set(CPACK_PACKAGE_CONTACT "softverbs developers <softverbs@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "RDMA (iWARP verbs, rdma_cm) and RDS in user space, without an RDMA NIC or kernel module")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# Debian's provider libraries stand in for mlx5/efa direct verbs (they answer "not
# supported" for our device); perftest, UCX and pyverbs need them to load.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "ibverbs-providers")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "ibverbs-utils, rdmacm-utils, perftest")
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS OFF)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
include(CPack)
