# Writes OUT, a C++ source defining tessera::service::EmbeddedWebFiles(): every
# file under WEB_DIR as bytes, by its path relative to WEB_DIR. Run by the build
# (cmake -P) whenever a file of web/ changes; see service/CMakeLists.txt.
#   cmake -DWEB_DIR=<web/> -DOUT=<web_files.cc> -P embed_web.cmake
file(GLOB_RECURSE files RELATIVE "${WEB_DIR}" "${WEB_DIR}/*")
list(SORT files)
set(arrays "")
set(entries "")
set(i 0)
foreach(rel IN LISTS files)
  file(READ "${WEB_DIR}/${rel}" hex HEX)
  file(SIZE "${WEB_DIR}/${rel}" size)
  # 16 bytes per line; a trailing 0 keeps empty files valid C++.
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  string(REGEX REPLACE "((0x..,){16})" "\\1\n    " bytes "${bytes}")
  string(APPEND arrays "const unsigned char kFile${i}[] = {\n    ${bytes}0x00};\n")
  string(APPEND entries "      {\"${rel}\", {reinterpret_cast<const char*>(kFile${i}), ${size}}},\n")
  math(EXPR i "${i} + 1")
endforeach()
set(text "// Generated from web/ by cmake/embed_web.cmake at build time; do not edit.
#include \"service/dashboard.h\"

namespace tessera::service {
namespace {

${arrays}
}  // namespace

const std::vector<WebFile>& EmbeddedWebFiles() {
  static const std::vector<WebFile> files = {
${entries}  };
  return files;
}

}  // namespace tessera::service
")
file(WRITE "${OUT}" "${text}")
