# Run by `cmake --install` (component dev): installs the headers client/client.h reaches, read from the compiler's
# -MM list the build wrote (cmake/packaging.cmake), under include/cake with their paths from the repository root
# (or from the build folder, for generated ones). CAKE_HEADERS_LIST, CAKE_SOURCE_DIR, CAKE_BINARY_DIRS and
# CAKE_HEADERS_DESTINATION are set by the install(CODE) before this script.
if(NOT EXISTS "${CAKE_HEADERS_LIST}")
  message(FATAL_ERROR "${CAKE_HEADERS_LIST} is missing: build before installing")
endif()
file(READ "${CAKE_HEADERS_LIST}" rule)
# "target: dep dep \<newline> dep ...": drop the target and the line continuations.
string(REGEX REPLACE "^[^:]*:" "" rule "${rule}")
string(REPLACE "\\\n" " " rule "${rule}")
string(STRIP "${rule}" rule)
string(REGEX REPLACE "[ \t\r\n]+" ";" headers "${rule}")
list(REMOVE_AT headers 0)  # the one-line source that includes client/client.h
set(installed 0)
foreach(header IN LISTS headers)
  get_filename_component(header "${header}" ABSOLUTE)
  set(relative "")
  # The build folder may sit inside the source folder (build-pkg/): try the generated folders first.
  foreach(base IN LISTS CAKE_BINARY_DIRS CAKE_SOURCE_DIR)
    string(LENGTH "${base}/" base_length)
    string(SUBSTRING "${header}" 0 ${base_length} head)
    if(head STREQUAL "${base}/")
      string(SUBSTRING "${header}" ${base_length} -1 relative)
      break()
    endif()
  endforeach()
  if(relative STREQUAL "")
    continue()  # a system header (Abseil, the standard library)
  endif()
  get_filename_component(folder "${relative}" DIRECTORY)
  file(INSTALL DESTINATION "${CMAKE_INSTALL_PREFIX}/${CAKE_HEADERS_DESTINATION}/${folder}" TYPE FILE
    FILES "${header}")
  math(EXPR installed "${installed} + 1")
endforeach()
if(installed EQUAL 0)
  message(FATAL_ERROR "no header found in ${CAKE_HEADERS_LIST}")
endif()
