// Test-only: a fresh directory under $TMPDIR, removed with its contents.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace taskgrid::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "taskgrid-test-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace taskgrid::testing
