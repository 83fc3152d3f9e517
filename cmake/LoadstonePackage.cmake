# The library a program links: libloadstone.so, target loadstone::loadstone. It holds the
# static libraries of io/, runtime/ and (when built) cuda/ with the static CUDA runtime, and
# exports only loadstone's own symbols (cmake/loadstone.map), so that a program needs nothing
# but the public headers and this one library: no fmt, liburing, nlohmann or CUDA of its own.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(LOADSTONE_PARTS loadstone_base loadstone_io loadstone_convert loadstone_sim loadstone_device loadstone_device_map loadstone_plan
  loadstone_pipeline loadstone_offload loadstone_dist_core)
if(LOADSTONE_HAVE_CUDA)
  list(APPEND LOADSTONE_PARTS loadstone_cuda)
endif()

add_library(loadstone SHARED ${PROJECT_SOURCE_DIR}/cmake/empty.cc)
add_library(loadstone::loadstone ALIAS loadstone)
set_target_properties(loadstone PROPERTIES
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
  LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}
  LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/loadstone.map)
# Every object of the parts, whole (nothing references them from inside the library); the
# parts are then linked as usual, for their own dependencies.
set(LOADSTONE_WHOLE "LINKER:--whole-archive")
foreach(part ${LOADSTONE_PARTS})
  list(APPEND LOADSTONE_WHOLE "$<TARGET_FILE:${part}>")
endforeach()
list(APPEND LOADSTONE_WHOLE "LINKER:--no-whole-archive")
add_dependencies(loadstone ${LOADSTONE_PARTS})
# -z nodelete: the SIGBUS handler io/mapped_copy.cc installs stays for the process's life, so the
# library must too (a dlclose would leave the handler pointing at unmapped code).
target_link_options(loadstone PRIVATE ${LOADSTONE_WHOLE}
  "LINKER:--version-script=${PROJECT_SOURCE_DIR}/cmake/loadstone.map" "LINKER:--no-undefined"
  "LINKER:-z,nodelete")
target_link_libraries(loadstone PRIVATE ${LOADSTONE_PARTS} PUBLIC Threads::Threads)
target_include_directories(loadstone PUBLIC
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(loadstone INTERFACE cxx_std_20)

install(TARGETS loadstone EXPORT loadstoneTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/loadstone
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h"
  PATTERN "torch.h" EXCLUDE)  # the LibTorch face's header goes with its library, below
install(FILES ${PROJECT_BINARY_DIR}/include/loadstone/version.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/loadstone)
install(EXPORT loadstoneTargets NAMESPACE loadstone::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/loadstone)

# The LibTorch face, when built: libloadstone_torch.so, loadstone/torch.h, and its own export
# set, so that find_package(loadstone) needs no LibTorch unless COMPONENTS torch is asked for.
if(TARGET loadstone_torch)
  set_target_properties(loadstone_torch PROPERTIES EXPORT_NAME torch)
  install(TARGETS loadstone_torch EXPORT loadstoneTorchTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(FILES ${PROJECT_SOURCE_DIR}/include/loadstone/torch.h
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/loadstone)
  install(EXPORT loadstoneTorchTargets NAMESPACE loadstone::
    DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/loadstone)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/loadstoneConfig.cmake.in
  ${PROJECT_BINARY_DIR}/loadstoneConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/loadstone)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/loadstoneConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)  # 0.x: a minor version may change the API
install(FILES ${PROJECT_BINARY_DIR}/loadstoneConfig.cmake
  ${PROJECT_BINARY_DIR}/loadstoneConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/loadstone)
