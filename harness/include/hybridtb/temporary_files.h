// Temporary files that an interrupted process must not leave behind. A file is written under a
// temporary name and renamed when complete (write_batch_file, the reports); while it is being
// written, a TemporaryFile registers its name, and install_interrupt_cleanup() makes SIGINT and
// SIGTERM remove every registered name before the process dies of the signal as it would have.
#pragma once

#include <string>

namespace hybridtb {

class TemporaryFile {
 public:
  explicit TemporaryFile(const std::string& path);  // registers `path` (it need not exist yet)
  ~TemporaryFile();                                  // unregisters it (the file itself is left alone)
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;

 private:
  int slot_ = -1;  // -1: more temporaries at once than the registry holds (then not cleaned up)
};

// Installs the SIGINT/SIGTERM handlers (idempotent). The handler only calls unlink, signal and
// raise, which are async-signal-safe.
void install_interrupt_cleanup();

}  // namespace hybridtb
