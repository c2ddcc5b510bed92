// The registry behind TemporaryFile (temporary_files.h): a fixed table of path buffers, claimed
// and released through atomic flags, so the signal handler reads it without locks or allocation.
#include "hybridtb/temporary_files.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <csignal>
#include <cstring>

namespace hybridtb {

namespace {

constexpr int kSlots = 32;
constexpr size_t kPathBytes = 4096;

struct Slot {
  std::atomic<bool> claimed{false};
  std::atomic<bool> ready{false};  // the path is complete and may be unlinked
  char path[kPathBytes] = {};
};

std::array<Slot, kSlots>& slots() {
  static std::array<Slot, kSlots> table;
  return table;
}

void remove_temporaries_and_die(int signal_number) {
  for (Slot& slot : slots()) {
    if (slot.ready.load()) ::unlink(slot.path);
  }
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

}  // namespace

TemporaryFile::TemporaryFile(const std::string& path) {
  if (path.size() >= kPathBytes) return;
  for (int i = 0; i < kSlots; ++i) {
    Slot& slot = slots()[static_cast<size_t>(i)];
    bool expected = false;
    if (slot.claimed.compare_exchange_strong(expected, true)) {
      std::memcpy(slot.path, path.c_str(), path.size() + 1);
      slot.ready.store(true);
      slot_ = i;
      return;
    }
  }
}

TemporaryFile::~TemporaryFile() {
  if (slot_ < 0) return;
  Slot& slot = slots()[static_cast<size_t>(slot_)];
  slot.ready.store(false);
  slot.claimed.store(false);
}

void install_interrupt_cleanup() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  slots();  // constructed before any handler can run
  std::signal(SIGINT, remove_temporaries_and_die);
  std::signal(SIGTERM, remove_temporaries_and_die);
}

}  // namespace hybridtb
