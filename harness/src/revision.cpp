// Runtime source revision (revision.h): git is asked through popen, with its stderr discarded, so a
// tree without git or without .git falls back quietly.
#include "hybridtb/revision.h"

#include <cstdio>
#include <cstdlib>
#include <memory>

#ifndef HYBRIDTB_GIT_COMMIT
#define HYBRIDTB_GIT_COMMIT "unknown"
#endif
#ifndef HYBRIDTB_SOURCE_DIR
#define HYBRIDTB_SOURCE_DIR "."
#endif

namespace hybridtb {

namespace {

// Single-quoted for the shell.
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `command`; its standard output (trailing newlines removed) if it exits 0, else nullopt-like "".
bool run(const std::string& command, std::string& output) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen((command + " 2>/dev/null").c_str(), "r"), pclose);
  if (!pipe) return false;
  char buffer[256];
  output.clear();
  while (fgets(buffer, sizeof buffer, pipe.get()) != nullptr) output += buffer;
  const int status = pclose(pipe.release());
  while (!output.empty() && (output.back() == '\n' || output.back() == '\r')) output.pop_back();
  return status == 0;
}

}  // namespace

SourceRevision source_revision_of(const std::string& source_dir) {
  SourceRevision r;
  if (const char* env = std::getenv("HYBRIDTB_GIT_COMMIT"); env != nullptr && *env != '\0') {
    r.commit = env;
    r.source = "environment";
    return r;
  }
  // git answers for the work tree that holds source_dir; a copy of the sources that this tree does
  // not track (an exported snapshot in an ignored folder of another checkout) is not its commit.
  std::string commit;
  std::string tracked;
  if (run("git -C " + quoted(source_dir) + " rev-parse --short HEAD", commit) && !commit.empty() &&
      run("git -C " + quoted(source_dir) + " ls-files -- .", tracked) && !tracked.empty()) {
    r.commit = commit;
    r.source = "git";
    std::string changes;
    if (run("git -C " + quoted(source_dir) + " status --porcelain --untracked-files=no", changes)) {
      r.dirty = !changes.empty();
    }
    return r;
  }
  r.commit = HYBRIDTB_GIT_COMMIT;
  r.source = r.commit == "unknown" ? "unknown" : "configure";
  return r;
}

const SourceRevision& source_revision() {
  static const SourceRevision revision = source_revision_of(HYBRIDTB_SOURCE_DIR);
  return revision;
}

}  // namespace hybridtb
