// The persistent tier of the compile cache: one file per compiled module in a directory.
// An entry carries the exact key material it was stored under and a checksum, so a
// truncated, corrupt, colliding or foreign entry is detected, dropped and recompiled.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace torchtpu::rt {

// A fast 64-bit hash (not cryptographic): keys the cache, checksums entries, fingerprints the plugin.
uint64_t hash64(const void* data, size_t size, uint64_t seed);
// 128 bits as 32 hex digits: the file name of an entry.
std::string hex_digest(const std::string& bytes);
// Creates every missing directory of `path` (like mkdir -p).
bool make_dirs(const std::string& path);
// Fingerprint of a file's bytes ("" if it cannot be read).
std::string file_digest(const std::string& path);

class CompileCache {
 public:
  // `dir` empty disables the persistent tier.
  explicit CompileCache(std::string dir) : dir_(std::move(dir)) {}
  bool enabled() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }

  enum class LoadResult { Missing, Hit, Rejected };
  // On Hit, `blob` holds the serialized executable. A Rejected entry has been deleted.
  LoadResult load(const std::string& key_material, std::string* blob) const;
  // Atomic: written to a temporary file in the same directory, then renamed into place.
  bool store(const std::string& key_material, const std::string& blob) const;
  std::string entry_path(const std::string& key_material) const;

 private:
  std::string dir_;
};

}  // namespace torchtpu::rt
