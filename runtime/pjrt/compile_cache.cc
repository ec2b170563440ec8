#include "pjrt/compile_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

namespace torchtpu::rt {
namespace {

constexpr char kMagic[8] = {'T', 'T', 'P', 'U', 'C', 'C', '0', '1'};

uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}

void put_u64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }

bool get_u64(const std::string& in, size_t& pos, uint64_t* v) {
  if (pos + sizeof *v > in.size()) return false;
  std::memcpy(v, in.data() + pos, sizeof *v);
  pos += sizeof *v;
  return true;
}

bool read_file(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

}  // namespace

bool make_dirs(const std::string& path) {
  std::string partial;
  std::stringstream parts(path);
  std::string part;
  if (!path.empty() && path[0] == '/') partial = "/";
  while (std::getline(parts, part, '/')) {
    if (part.empty()) continue;
    partial += part + "/";
    if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  return true;
}

uint64_t hash64(const void* data, size_t size, uint64_t seed) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint64_t h = mix(seed ^ (size * 0x9e3779b97f4a7c15ULL));
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes + i, 8);
    h = (h ^ mix(word)) * 0x100000001b3ULL;
    h ^= h >> 29;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, bytes + i, size - i);
  return mix(h ^ mix(tail ^ 0xa5a5a5a5a5a5a5a5ULL));
}

std::string hex_digest(const std::string& bytes) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx",
                static_cast<unsigned long long>(hash64(bytes.data(), bytes.size(), 1)),
                static_cast<unsigned long long>(hash64(bytes.data(), bytes.size(), 2)));
  return buf;
}

std::string file_digest(const std::string& path) {
  std::string contents;
  if (!read_file(path, &contents)) return "";
  return hex_digest(contents);
}

std::string CompileCache::entry_path(const std::string& key_material) const {
  return dir_ + "/" + hex_digest(key_material) + ".pjrtexe";
}

CompileCache::LoadResult CompileCache::load(const std::string& key_material, std::string* blob) const {
  if (!enabled()) return LoadResult::Missing;
  const std::string path = entry_path(key_material);
  std::string data;
  if (!read_file(path, &data)) return LoadResult::Missing;
  // Layout: magic | u64 key size | key | u64 blob size | blob | u64 checksum of everything before.
  size_t pos = sizeof kMagic;
  uint64_t key_size = 0, blob_size = 0, checksum = 0;
  bool ok = data.size() >= sizeof kMagic && std::memcmp(data.data(), kMagic, sizeof kMagic) == 0 &&
            get_u64(data, pos, &key_size) && key_size <= data.size() - pos &&
            data.compare(pos, key_size, key_material) == 0 && key_size == key_material.size();
  if (ok) {
    pos += key_size;
    ok = get_u64(data, pos, &blob_size) && blob_size <= data.size() - pos;
  }
  if (ok) {
    const size_t blob_pos = pos;
    pos += blob_size;
    const size_t body_size = pos;
    ok = get_u64(data, pos, &checksum) && pos == data.size() && checksum == hash64(data.data(), body_size, 7);
    if (ok) blob->assign(data, blob_pos, blob_size);
  }
  if (!ok) {
    std::remove(path.c_str());
    return LoadResult::Rejected;
  }
  return LoadResult::Hit;
}

bool CompileCache::store(const std::string& key_material, const std::string& blob) const {
  if (!enabled() || !make_dirs(dir_)) return false;
  std::string data(kMagic, sizeof kMagic);
  put_u64(data, key_material.size());
  data += key_material;
  put_u64(data, blob.size());
  data += blob;
  put_u64(data, hash64(data.data(), data.size(), 7));

  static std::atomic<uint64_t> counter{0};
  const std::string path = entry_path(key_material);
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return false;
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace torchtpu::rt
