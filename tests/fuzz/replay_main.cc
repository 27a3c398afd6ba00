// Runs a fuzz target over the checked-in corpus without libFuzzer, so every
// build (GCC, the sanitizer builds) replays the seeds as a test. Seeds are
// text-format protos (*.textproto, readable and reviewable); anything else
// is passed to the target as raw bytes. Directories are read recursively
// (the seeds, and found/: what the long runs kept).
//
//   fuzz_submit_replay DIR_OR_FILE...

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "google/protobuf/text_format.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

bool RunOne(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  std::string bytes = buf.str();
  if (path.extension() == ".textproto") {
    const google::protobuf::Message* prototype = taskgrid::fuzz::InputPrototype();
    if (prototype == nullptr) {
      std::fprintf(stderr, "%s: a text-format seed for a target that takes raw bytes\n",
                   path.c_str());
      return false;
    }
    std::unique_ptr<google::protobuf::Message> msg(prototype->New());
    if (!google::protobuf::TextFormat::ParseFromString(bytes, msg.get())) {
      std::fprintf(stderr, "%s: not a valid %s in text format\n", path.c_str(),
                   msg->GetTypeName().c_str());
      return false;
    }
    bytes = msg->SerializeAsString();
  }
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path p(argv[i]);
    if (std::filesystem::is_directory(p)) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(p)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
    } else {
      files.push_back(p);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "usage: %s DIR_OR_FILE... (no seed found)\n", argv[0]);
    return 2;
  }
  int bad = 0;
  for (const auto& f : files) bad += RunOne(f) ? 0 : 1;
  std::printf("%zu seeds run, %d unreadable\n", files.size(), bad);
  return bad == 0 ? 0 : 1;
}
