# The ways specdec is installed besides the CMake package (included from the top-level
# CMakeLists.txt when SPECDEC_INSTALL is on, after GNUInstallDirs):
#  - a pkg-config file, share/pkgconfig/specdec.pc (the library is header-only, so it is
#    architecture-independent): `pkg-config --cflags specdec` gives specdec's include folder and,
#    through `Requires: eigen3`, Eigen's flags;
#  - a Debian package through CPack (`cpack -G DEB` in the build folder): libspecdec-dev,
#    depending on libeigen3-dev.

# The .pc file names its prefix, which is known only when installing (`cmake --install
# --prefix P`, or CPack's staging install into /usr): it is written then, straight to its
# destination (so that concurrent installs of one build into different prefixes do not share
# a file), and added to the install manifest.
set(SPECDEC_PKGCONFIG_DIR "${CMAKE_INSTALL_DATADIR}/pkgconfig")
set(SPECDEC_PC_PREFIX "@SPECDEC_PC_PREFIX@")
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(SPECDEC_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(SPECDEC_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file("${CMAKE_CURRENT_LIST_DIR}/specdec.pc.in" "${PROJECT_BINARY_DIR}/specdec.pc.template" @ONLY)
install(CODE "
  set(SPECDEC_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  set(_specdec_pc \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${SPECDEC_PKGCONFIG_DIR}/specdec.pc\")
  message(STATUS \"Installing: \${_specdec_pc}\")
  configure_file(\"${PROJECT_BINARY_DIR}/specdec.pc.template\" \"\${_specdec_pc}\" @ONLY)
  list(APPEND CMAKE_INSTALL_MANIFEST_FILES \"\${_specdec_pc}\")
")

# Debian package. Only what the install rules above install goes in (headers, CMake package,
# pkg-config file); configure with the tests, examples and benchmarks off to package quickly.
set(CPACK_PACKAGE_NAME "specdec")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_VENDOR "specdec developers")
set(CPACK_PACKAGE_CONTACT "specdec developers")
set(CPACK_RESOURCE_FILE_LICENSE "${PROJECT_SOURCE_DIR}/LICENSE")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_DEBIAN_PACKAGE_NAME "libspecdec-dev")
set(CPACK_DEBIAN_FILE_NAME "DEB-DEFAULT")
set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE "all")
set(CPACK_DEBIAN_PACKAGE_SECTION "libdevel")
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libeigen3-dev (>= 3.4)")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "${PROJECT_DESCRIPTION}\n Speculative decoding (Leviathan et al. 2023) over any draft and target\n model that give next-token logits; header-only, on Eigen.")
if(NOT CPACK_GENERATOR)
  set(CPACK_GENERATOR "DEB")
endif()
include(CPack)
