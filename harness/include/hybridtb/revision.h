// The source revision a result or report is labelled with, read when the tool runs, not when the
// build was configured: after a commit and a rebuild (even without re-running CMake) the label
// names the new commit, and uncommitted changes to tracked files are flagged as "dirty".
//
// Order of sources: the environment variable HYBRIDTB_GIT_COMMIT (set it where the tree has no
// .git, e.g. a copy on a GPU machine), then `git rev-parse` in the source tree the binary was built
// from when git tracks files there (not for a copy nested untracked in another checkout), then the
// commit CMake saw at configure time, else "unknown".
#pragma once

#include <string>

namespace hybridtb {

struct SourceRevision {
  std::string commit = "unknown";  // short hash
  bool dirty = false;              // tracked files differ from the commit (git status)
  std::string source;              // "environment", "git", "configure" or "unknown"
  // "abc1234", or "abc1234-dirty" when tracked files were modified.
  std::string label() const { return dirty ? commit + "-dirty" : commit; }
};

// The revision of the git work tree at `source_dir` (the sources above, with `source_dir` for git).
SourceRevision source_revision_of(const std::string& source_dir);
// The revision of the tree this binary was built from (cached after the first call).
const SourceRevision& source_revision();

}  // namespace hybridtb
