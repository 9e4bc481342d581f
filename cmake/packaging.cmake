# Installation and the Debian packages. `cmake --install` lays the files out exactly as the packages do, and
# `cpack -G DEB` (scripts/package) makes two packages of them:
#   cake         caked, cakectl, the systemd unit, sysusers.d and tmpfiles.d files, the default config (a conffile),
#                the docs, the man pages and the Python client;
#   libcake-dev  the C++ client library engines link: static libraries, headers, the CMake package (cake::client)
#                and pkg-config's cake-client.
# Two packages because an engine's build needs gRPC's, protobuf's and Abseil's -dev packages, which a host that only
# runs the daemon should not get. Included last from the top-level CMakeLists.txt, once every target exists.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

option(CAKE_MAN_PAGES "Generate man pages from --help with help2man (skipped when help2man is missing)" ON)
option(CAKE_PACKAGE_BENCH "Install cake-bench too (it needs a build with CAKE_BUILD_BENCH)" OFF)

# Every destination is relative to the prefix, decided at install time, so `cpack` from any build (the packages
# always use /usr) and `cmake --install --prefix P` (everything under P) both lay it out right. Libraries go to
# Debian's multiarch folder, which the linker, pkg-config and find_package search under /usr and /usr/local alike.
if(CMAKE_LIBRARY_ARCHITECTURE)
  set(CAKE_INSTALL_LIBDIR lib/${CMAKE_LIBRARY_ARCHITECTURE})
else()
  set(CAKE_INSTALL_LIBDIR ${CMAKE_INSTALL_LIBDIR})
endif()
set(CAKE_INSTALL_DOCDIR ${CMAKE_INSTALL_DATAROOTDIR}/doc/cake)
# Where Debian's /usr/bin/python3 finds modules that are not its own (with /usr/local: /usr/local/lib/python3/...).
set(CAKE_INSTALL_PYTHONDIR lib/python3/dist-packages)
set(CAKE_INSTALL_CMAKEDIR ${CAKE_INSTALL_LIBDIR}/cmake/cake)
set(CAKE_PACKAGING_DIR ${CMAKE_BINARY_DIR}/packaging)

# ---------------------------------------------------------------------------------------------------------------
# cake: the daemon and its tools
install(TARGETS caked cakectl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT daemon)
# cake-bench is a developer's benchmark (many of its runs compare against fio, soak needs the tests' vanishing
# engine beside it) and links OpenBLAS: not in the package unless asked for.
if(CAKE_PACKAGE_BENCH)
  if(NOT TARGET cake-bench)
    message(FATAL_ERROR "CAKE_PACKAGE_BENCH=ON needs CAKE_BUILD_BENCH=ON")
  endif()
  install(TARGETS cake-bench RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT daemon)
endif()
# The prefix /usr (a package) puts the config in /etc/cake and the unit, sysusers.d and tmpfiles.d files under
# /lib (bookworm ships units in /lib/systemd/system: DEP17 forbids moving files between / and /usr for now; on a
# merged-/usr system both are one folder). Any other prefix keeps them under it. file(INSTALL) honours DESTDIR.
install(CODE "
if(CMAKE_INSTALL_PREFIX STREQUAL \"/usr\")
  set(cake_etc /etc)
  set(cake_syslib /lib)
else()
  set(cake_etc \"\${CMAKE_INSTALL_PREFIX}/etc\")
  set(cake_syslib \"\${CMAKE_INSTALL_PREFIX}/lib\")
endif()
file(INSTALL DESTINATION \"\${cake_syslib}/systemd/system\" TYPE FILE
  FILES \"${PROJECT_SOURCE_DIR}/deploy/caked.service\")
file(INSTALL DESTINATION \"\${cake_syslib}/sysusers.d\" TYPE FILE
  FILES \"${PROJECT_SOURCE_DIR}/deploy/sysusers.d/cake.conf\")
file(INSTALL DESTINATION \"\${cake_syslib}/tmpfiles.d\" TYPE FILE
  FILES \"${PROJECT_SOURCE_DIR}/deploy/tmpfiles.d/cake.conf\")
# 0640 already; the group (cake) is the postinst's, which runs once the user exists.
file(INSTALL DESTINATION \"\${cake_etc}/cake\" TYPE FILE PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ
  FILES \"${PROJECT_SOURCE_DIR}/deploy/caked.toml\")
" COMPONENT daemon)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CAKE_INSTALL_DOCDIR} COMPONENT daemon)

# The Python client and the PyTorch engine, with the cake.v1 stubs python/ generated into the build (what
# deploy/install.sh copied before there was a package).
if(CAKE_BUILD_PYTHON)
  foreach(py_package cake cake_torch_engine)
    install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/${py_package} DESTINATION ${CAKE_INSTALL_PYTHONDIR}
      COMPONENT daemon FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)
  endforeach()
  install(DIRECTORY ${CMAKE_BINARY_DIR}/python/cake/v1 DESTINATION ${CAKE_INSTALL_PYTHONDIR}/cake COMPONENT daemon
    FILES_MATCHING PATTERN "*.py")
  install(FILES ${CMAKE_BINARY_DIR}/python/cake/_version.py DESTINATION ${CAKE_INSTALL_PYTHONDIR}/cake
    COMPONENT daemon)  # cake.__version__, the daemon's
endif()

# Man pages from each program's --help (help2man), rebuilt when the program is. caked is a daemon: section 8.
find_program(CAKE_HELP2MAN help2man)
find_program(CAKE_GZIP gzip)
if(CAKE_SANITIZE OR CAKE_FUZZ)
  # Nobody packages these builds, and a sanitizer's report at exit would fail help2man, and so the build.
elseif(CAKE_MAN_PAGES AND (NOT CAKE_HELP2MAN OR NOT CAKE_GZIP))
  message(STATUS "cake: help2man or gzip not found: no man pages (scripts/setup installs help2man)")
elseif(CAKE_MAN_PAGES)
  set(cake_man_pages)
  foreach(spec "caked;8;the Cake KV-cache loader daemon" "cakectl;1;inspect and manage a running caked"
               "cake-bench;1;benchmarks for caked")
    list(GET spec 0 program)
    list(GET spec 1 section)
    list(GET spec 2 summary)
    if(NOT TARGET ${program})
      continue()
    endif()
    # man/man<section>/: a MANPATH entry as it is (scripts/check-unit resolves the unit's man:caked(8) there).
    set(page ${CAKE_PACKAGING_DIR}/man/man${section}/${program}.${section})
    set(include_file ${PROJECT_SOURCE_DIR}/deploy/man/${program}.h2m)
    set(include_args)
    set(include_depends)
    if(EXISTS ${include_file})
      set(include_args --include=${include_file})
      set(include_depends ${include_file})
    endif()
    # Run by name from PATH, so the usage line says "caked", not the build folder's path (CLI11 prints argv[0]).
    add_custom_command(OUTPUT ${page}.gz
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CAKE_PACKAGING_DIR}/man/man${section}
      COMMAND ${CMAKE_COMMAND} -E env "PATH=$<TARGET_FILE_DIR:${program}>:$ENV{PATH}"
              ${CAKE_HELP2MAN} --no-info --section=${section} --name=${summary} ${include_args}
              --output=${page} ${program}
      COMMAND ${CAKE_GZIP} -9nf ${page}
      DEPENDS ${program} ${include_depends}
      COMMENT "Generating the ${program}(${section}) man page"
      VERBATIM)
    list(APPEND cake_man_pages ${page}.gz)
    if(NOT program STREQUAL "cake-bench" OR CAKE_PACKAGE_BENCH)
      install(FILES ${page}.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man${section} COMPONENT daemon)
    endif()
  endforeach()
  add_custom_target(cake_man_pages ALL DEPENDS ${cake_man_pages})
endif()

# ---------------------------------------------------------------------------------------------------------------
# libcake-dev: cake_client and every static library of this tree it links, found by walking its link closure (so
# a library the client starts to link is installed without editing this file).
set(cake_client_closure)
set(cake_client_imported)
function(cake_walk_link_closure target)
  set(deps)
  foreach(property LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
    get_target_property(value ${target} ${property})
    if(value)
      list(APPEND deps ${value})
    endif()
  endforeach()
  foreach(dep IN LISTS deps)
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" dep "${dep}")
    if(dep MATCHES "^\\$<")
      continue()  # no other generator expressions in these libraries' links today
    endif()
    if(TARGET ${dep})
      get_target_property(aliased ${dep} ALIASED_TARGET)
      if(aliased)
        set(dep ${aliased})
      endif()
    endif()
    if(dep IN_LIST cake_client_closure OR dep IN_LIST cake_client_imported)
      continue()
    endif()
    set(imported TRUE)  # a plain library name (rt) is the system's, like an imported target
    if(TARGET ${dep})
      get_target_property(imported ${dep} IMPORTED)
    endif()
    if(imported)
      list(APPEND cake_client_imported ${dep})
    else()
      cake_walk_link_closure(${dep})  # updates both lists in this scope
    endif()
  endforeach()
  # Post-order: a library after everything it links, so the reversed list is a valid static link order.
  list(APPEND cake_client_closure ${target})
  set(cake_client_closure ${cake_client_closure} PARENT_SCOPE)
  set(cake_client_imported ${cake_client_imported} PARENT_SCOPE)
endfunction()
cake_walk_link_closure(cake_client)
list(REVERSE cake_client_closure)  # cake_client first, cake_base last

# The include paths sources use ("client/client.h", "cake/v1/kv.pb.h") resolve under include/cake; the build tree's
# absolute folders stay build-only.
foreach(target IN LISTS cake_client_closure)
  get_target_property(includes ${target} INTERFACE_INCLUDE_DIRECTORIES)
  set(wrapped)
  if(includes)
    foreach(dir IN LISTS includes)
      if(IS_ABSOLUTE "${dir}" AND NOT dir MATCHES "^\\$<")
        list(APPEND wrapped "$<BUILD_INTERFACE:${dir}>")
      else()
        list(APPEND wrapped "${dir}")
      endif()
    endforeach()
  endif()
  list(APPEND wrapped "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/cake>")
  set_property(TARGET ${target} PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${wrapped}")
  string(REGEX REPLACE "^cake_" "" export_name ${target})
  set_property(TARGET ${target} PROPERTY EXPORT_NAME ${export_name})
endforeach()
# client.h uses std::span: consumers compile as C++20 at least.
target_compile_features(cake_client INTERFACE cxx_std_20)
# The same name inside this build, for a project that adds this tree with add_subdirectory.
if(NOT TARGET cake::client)
  add_library(cake::client ALIAS cake_client)
endif()

option(CAKE_STRIP_STATIC_LIBS "Install the client's static libraries without debug info (as Debian ships them)" ON)
install(TARGETS ${cake_client_closure} EXPORT cakeTargets ARCHIVE DESTINATION ${CAKE_INSTALL_LIBDIR}
  COMPONENT dev)
# Debug info is most of their size (26 of 27 MiB); the binaries' goes to cake-dbgsym instead.
if(CAKE_STRIP_STATIC_LIBS AND CMAKE_STRIP)
  set(cake_static_files)
  foreach(target IN LISTS cake_client_closure)
    list(APPEND cake_static_files "\${CMAKE_INSTALL_PREFIX}/${CAKE_INSTALL_LIBDIR}/$<TARGET_FILE_NAME:${target}>")
  endforeach()
  install(CODE "
foreach(lib ${cake_static_files})
  execute_process(COMMAND \"${CMAKE_STRIP}\" --strip-debug --enable-deterministic-archives \"\$ENV{DESTDIR}\${lib}\"
    COMMAND_ERROR_IS_FATAL ANY)
endforeach()" COMPONENT dev)
endif()
# The headers client/client.h reaches, as the compiler finds them (its -MM list, which is also the rule's depfile:
# it is rewritten when any of them changes), installed under include/cake with their paths from the repository root.
set(cake_client_headers_list ${CAKE_PACKAGING_DIR}/client-headers.d)
file(CONFIGURE OUTPUT ${CAKE_PACKAGING_DIR}/client-headers.cc CONTENT "#include \"client/client.h\"\n")
add_custom_command(OUTPUT ${cake_client_headers_list}
  COMMAND ${CMAKE_CXX_COMPILER} -std=c++20 -MM -MT ${cake_client_headers_list} -MF ${cake_client_headers_list}
          -I${PROJECT_SOURCE_DIR} -I${PROJECT_BINARY_DIR} -I${PROJECT_BINARY_DIR}/proto
          ${CAKE_PACKAGING_DIR}/client-headers.cc
  DEPENDS ${PROJECT_SOURCE_DIR}/client/client.h ${CAKE_PACKAGING_DIR}/client-headers.cc
  DEPFILE ${cake_client_headers_list}
  COMMENT "Listing the headers client/client.h includes"
  VERBATIM)
add_custom_target(cake_client_headers ALL DEPENDS ${cake_client_headers_list})
add_dependencies(cake_client_headers cake_proto)  # a generated header it might include exists first
install(CODE "set(CAKE_HEADERS_LIST \"${cake_client_headers_list}\")
set(CAKE_SOURCE_DIR \"${PROJECT_SOURCE_DIR}\")
set(CAKE_BINARY_DIRS \"${PROJECT_BINARY_DIR}/proto;${PROJECT_BINARY_DIR}\")
set(CAKE_HEADERS_DESTINATION \"${CMAKE_INSTALL_INCLUDEDIR}/cake\")" COMPONENT dev)
install(SCRIPT ${CMAKE_CURRENT_LIST_DIR}/install-client-headers.cmake COMPONENT dev)
# The wire protocol for other languages and its generated C++ messages and stubs (cake::proto's interface).
get_target_property(cake_proto_binary_dir cake_proto BINARY_DIR)
install(DIRECTORY ${cake_proto_binary_dir}/cake DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/cake COMPONENT dev
  FILES_MATCHING PATTERN "*.pb.h")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/proto/cake DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/cake COMPONENT dev
  FILES_MATCHING PATTERN "*.proto")

# A CUDA build's regions link the CUDA runtime statically. It goes into the package beside the libraries
# (libcudart_static.a is redistributable, unmodified, under the CUDA EULA's Attachment A; its licence goes with
# it), so an engine links cake::client without a CUDA toolkit. cakeConfig.cmake uses the consumer's own
# CUDA::cudart_static instead when it already has one.
set(CAKE_BUNDLED_CUDART "")
if("CUDA::cudart_static" IN_LIST cake_client_imported)
  get_target_property(cudart_location CUDA::cudart_static IMPORTED_LOCATION)
  if(NOT cudart_location)
    get_target_property(cudart_location CUDA::cudart_static LOCATION)
  endif()
  set(CAKE_BUNDLED_CUDART ${CAKE_INSTALL_LIBDIR}/cake/libcudart_static.a)
  install(FILES ${cudart_location} DESTINATION ${CAKE_INSTALL_LIBDIR}/cake RENAME libcudart_static.a COMPONENT dev)
  # The toolkit's root: EULA.txt in NVIDIA's installers, the runtime wheel's licence in a pip-built toolkit.
  get_filename_component(cuda_root "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  file(GLOB cudart_licences ${cuda_root}/EULA.txt ${cuda_root}/doc/EULA.txt
    ${cuda_root}/dist-info/nvidia_cuda_runtime*/licenses/License.txt)
  if(cudart_licences)
    list(GET cudart_licences 0 cudart_licence)
    install(FILES ${cudart_licence} DESTINATION ${CMAKE_INSTALL_DATAROOTDIR}/doc/libcake-dev
      RENAME CUDA-EULA.txt COMPONENT dev)
  else()
    message(WARNING "cake: the CUDA runtime's licence was not found under ${cuda_root}; "
                    "libcake-dev ships libcudart_static.a without it")
  endif()
endif()

install(EXPORT cakeTargets NAMESPACE cake:: DESTINATION ${CAKE_INSTALL_CMAKEDIR} COMPONENT dev)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/cakeConfig.cmake.in ${CAKE_PACKAGING_DIR}/cakeConfig.cmake
  INSTALL_DESTINATION ${CAKE_INSTALL_CMAKEDIR})
# 0.x: a new minor version may change the client's API.
write_basic_package_version_file(${CAKE_PACKAGING_DIR}/cakeConfigVersion.cmake VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES ${CAKE_PACKAGING_DIR}/cakeConfig.cmake ${CAKE_PACKAGING_DIR}/cakeConfigVersion.cmake
  DESTINATION ${CAKE_INSTALL_CMAKEDIR} COMPONENT dev)

# pkg-config: the same libraries in link order, and the pkg-config modules of what they link.
set(CAKE_PC_LIBS)
foreach(target IN LISTS cake_client_closure)
  get_target_property(output_name ${target} OUTPUT_NAME)
  if(NOT output_name)
    set(output_name ${target})
  endif()
  string(APPEND CAKE_PC_LIBS " -l${output_name}")
endforeach()
set(CAKE_PC_REQUIRES)
set(CAKE_PC_EXTRA_LIBS)
foreach(dep IN LISTS cake_client_imported)
  if(dep MATCHES "^absl::(.*)$")
    list(APPEND CAKE_PC_REQUIRES absl_${CMAKE_MATCH_1})
  elseif(dep STREQUAL "gRPC::grpc++")
    list(APPEND CAKE_PC_REQUIRES grpc++)
  elseif(dep STREQUAL "protobuf::libprotobuf")
    list(APPEND CAKE_PC_REQUIRES protobuf)
  elseif(dep STREQUAL "OpenSSL::Crypto")
    list(APPEND CAKE_PC_REQUIRES libcrypto)
  elseif(dep STREQUAL "OpenSSL::SSL")
    list(APPEND CAKE_PC_REQUIRES libssl)
  elseif(dep STREQUAL "CUDA::cudart_static")
    list(APPEND CAKE_PC_EXTRA_LIBS "\${libdir}/cake/libcudart_static.a" -ldl -lrt)
  elseif(dep STREQUAL "Threads::Threads")
    list(APPEND CAKE_PC_EXTRA_LIBS -pthread)
  elseif(NOT dep MATCHES "::")
    list(APPEND CAKE_PC_EXTRA_LIBS -l${dep})
  else()
    message(WARNING "cake: cake-client.pc does not know the pkg-config module of ${dep}")
  endif()
endforeach()
# The static CUDA runtime before the system libraries it needs.
list(FIND CAKE_PC_EXTRA_LIBS "\${libdir}/cake/libcudart_static.a" cudart_index)
if(cudart_index GREATER 0)
  list(REMOVE_AT CAKE_PC_EXTRA_LIBS ${cudart_index})
  list(INSERT CAKE_PC_EXTRA_LIBS 0 "\${libdir}/cake/libcudart_static.a")
endif()
list(REMOVE_DUPLICATES CAKE_PC_REQUIRES)
list(REMOVE_DUPLICATES CAKE_PC_EXTRA_LIBS)
list(JOIN CAKE_PC_REQUIRES " " CAKE_PC_REQUIRES)
list(JOIN CAKE_PC_EXTRA_LIBS " " CAKE_PC_EXTRA_LIBS)
# Relocatable: the prefix is found from the .pc file's own folder, so a DESTDIR staging tree works as it is.
file(RELATIVE_PATH CAKE_PC_PREFIX_FROM_PCDIR /prefix/${CAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" CAKE_PC_PREFIX_FROM_PCDIR "${CAKE_PC_PREFIX_FROM_PCDIR}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/cake-client.pc.in ${CAKE_PACKAGING_DIR}/cake-client.pc @ONLY)
install(FILES ${CAKE_PACKAGING_DIR}/cake-client.pc DESTINATION ${CAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)

# ---------------------------------------------------------------------------------------------------------------
# CPack: the .deb files (scripts/package configures with -DCMAKE_INSTALL_PREFIX=/usr and runs cpack -G DEB).
set(CAKE_PACKAGE_MAINTAINER "Cake maintainers <cake-maintainers@example.com>" CACHE STRING
  "Maintainer field of the .deb packages")
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME cake)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${CAKE_PACKAGE_MAINTAINER}")
# Staged with DESTDIR and the prefix /usr whatever this build's own prefix is: cpack in the test build makes the
# same layout as scripts/package.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/packages)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL daemon dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # <name>_<version>-<release>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${CAKE_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Maintainer scripts executable, control files 0644, as dpkg expects.
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME cake)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION net)
# First line: the synopsis; CPack indents the rest as Debian's extended description.
set(CPACK_DEBIAN_DAEMON_DESCRIPTION "KV-cache loader daemon for LLM inference engines
caked keeps the KV cache of prompt prefixes in DRAM, on local disk (O_DIRECT, io_uring) and in a shared Redis,
and loads it into an engine's shared memory or GPU memory while the engine computes the rest of the prompt.
This package has the daemon, cakectl, the systemd unit (installed disabled), the default configuration
/etc/cake/caked.toml, the documentation and the Python client (cake).")
# dpkg-shlibdeps computes Depends from the binaries (gRPC, protobuf, liburing, hiredis, spdlog, ...).
set(CPACK_DEBIAN_DAEMON_PACKAGE_SHLIBDEPS ON)
# Besides the libraries: the unit's ExecReload runs /bin/kill (procps, "important" but not essential).
set(CPACK_DEBIAN_DAEMON_PACKAGE_DEPENDS "procps")
set(CPACK_DEBIAN_DAEMON_PACKAGE_RECOMMENDS "python3, python3-grpcio, python3-protobuf, python3-numpy")
set(CPACK_DEBIAN_DAEMON_PACKAGE_SUGGESTS "libcake-dev, redis-server, python3-torch")
# Stripped binaries in cake, their debug info in cake-dbgsym (a .ddeb beside it), as Debian ships them.
set(CPACK_DEBIAN_DAEMON_DEBUGINFO_PACKAGE ON)
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/deploy/debian/conffiles
  ${PROJECT_SOURCE_DIR}/deploy/debian/postinst ${PROJECT_SOURCE_DIR}/deploy/debian/prerm
  ${PROJECT_SOURCE_DIR}/deploy/debian/postrm)

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libcake-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_DESCRIPTION "C++ client library of the Cake KV-cache loader daemon
Static libraries and headers of cake::Client, the library an inference engine links to use caked: regions,
lookups, stores and Cake loads. find_package(cake CONFIG) gives the target cake::client; pkg-config's module is
cake-client. A CUDA build carries the CUDA runtime it links (libcudart_static.a, redistributable under NVIDIA's
CUDA EULA, which is in /usr/share/doc/libcake-dev).")
set(CPACK_DEBIAN_DEV_PACKAGE_SHLIBDEPS OFF)  # static libraries only: what they need is below
# What cakeConfig.cmake's find_dependency calls need (gRPC's CMake config also checks its protoc plugins).
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
  "libgrpc++-dev (>= 1.51), protobuf-compiler-grpc, libprotobuf-dev, libabsl-dev, libssl-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_RECOMMENDS "cmake, pkg-config, cake (= ${PROJECT_VERSION}-1)")
include(CPack)
