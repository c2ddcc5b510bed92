// The source revision results and reports are labelled with (hybridtb/revision.h) is read when the
// tool runs: in a scratch git repository, the label is HEAD's short hash, gains "-dirty" when a
// tracked file changes, names the new commit after a commit, and yields to HYBRIDTB_GIT_COMMIT; an
// untracked copy nested in the checkout does not take the checkout's commit.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <string>

#include "hybridtb/revision.h"

namespace hybridtb {
namespace {

namespace fs = std::filesystem;

std::string shell(const std::string& command) {
  std::string out;
  FILE* pipe = popen((command + " 2>/dev/null").c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[256];
  while (fgets(buffer, sizeof buffer, pipe) != nullptr) out += buffer;
  pclose(pipe);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class RevisionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::system("git --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "git is not installed";
    unsetenv("HYBRIDTB_GIT_COMMIT");
    dir_ = fs::temp_directory_path() / ("hybridtb-revision-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    git("init -q");
    std::ofstream(dir_ / "file.txt") << "one\n";
    commit("first");
  }
  void TearDown() override { fs::remove_all(dir_); }

  void git(const std::string& args) {
    ASSERT_EQ(std::system(("git -C " + dir_.string() + " -c user.name=t -c user.email=t@t " + args + " >/dev/null 2>&1")
                              .c_str()),
              0)
        << args;
  }
  void commit(const std::string& message) {
    git("add -A");
    git("commit -q -m " + message);
  }
  std::string head() { return shell("git -C " + dir_.string() + " rev-parse --short HEAD"); }

  fs::path dir_;
};

TEST_F(RevisionTest, TheLabelFollowsCommitsAndFlagsUncommittedChanges) {
  const SourceRevision first = source_revision_of(dir_.string());
  EXPECT_EQ(first.source, "git");
  EXPECT_EQ(first.commit, head());
  EXPECT_FALSE(first.dirty);
  EXPECT_EQ(first.label(), head());

  std::ofstream(dir_ / "file.txt") << "two\n";
  const SourceRevision edited = source_revision_of(dir_.string());
  EXPECT_EQ(edited.commit, first.commit);
  EXPECT_TRUE(edited.dirty);
  EXPECT_EQ(edited.label(), first.commit + "-dirty");

  commit("second");
  const SourceRevision second = source_revision_of(dir_.string());
  EXPECT_NE(second.commit, first.commit);
  EXPECT_EQ(second.commit, head());
  EXPECT_FALSE(second.dirty);

  std::ofstream(dir_ / "untracked.txt") << "new\n";
  EXPECT_FALSE(source_revision_of(dir_.string()).dirty) << "untracked files do not make a build dirty";
}

TEST_F(RevisionTest, TheEnvironmentNamesTheCommitWhereThereIsNoGit) {
  setenv("HYBRIDTB_GIT_COMMIT", "abc1234", 1);
  const SourceRevision r = source_revision_of(dir_.string());
  unsetenv("HYBRIDTB_GIT_COMMIT");
  EXPECT_EQ(r.commit, "abc1234");
  EXPECT_EQ(r.source, "environment");
}

TEST_F(RevisionTest, AnUntrackedCopyInsideAnotherCheckoutIsNotItsCommit) {
  // An exported copy of the sources in an ignored folder of a checkout: git would answer with the
  // enclosing checkout's HEAD, which is not the copy's commit.
  std::ofstream(dir_ / ".gitignore") << "snapshot/\n";
  commit("ignore");
  fs::create_directories(dir_ / "snapshot");
  std::ofstream(dir_ / "snapshot" / "file.txt") << "copy\n";
  const SourceRevision r = source_revision_of((dir_ / "snapshot").string());
  EXPECT_NE(r.source, "git");
  EXPECT_NE(r.commit, head());
  EXPECT_FALSE(r.dirty);
}

TEST(Revision, ATreeWithoutGitFallsBackToTheConfigureTimeCommit) {
  unsetenv("HYBRIDTB_GIT_COMMIT");
  const fs::path dir = fs::temp_directory_path() / ("hybridtb-no-git-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const SourceRevision r = source_revision_of(dir.string());
  fs::remove_all(dir);
  EXPECT_TRUE(r.source == "configure" || r.source == "unknown") << r.source;
  EXPECT_FALSE(r.commit.empty());
  EXPECT_FALSE(r.dirty);
}

}  // namespace
}  // namespace hybridtb
