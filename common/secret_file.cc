#include "common/secret_file.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace taskgrid {

std::string OthersMayReadWarning(const std::string& path, absl::string_view flag) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || (st.st_mode & 0077) == 0) return "";
  return absl::StrCat(flag, " ", path, " can be read by other users (mode ",
                      absl::StrFormat("%o", st.st_mode & 0777), "): chmod 600 it");
}

}  // namespace taskgrid
