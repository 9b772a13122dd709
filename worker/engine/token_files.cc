#include "worker/engine/token_files.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/engine/rng.h"

namespace boulder::engine {
namespace {

absl::Status ErrnoError(const std::string& path, absl::string_view what) {
  const int e = errno;
  const std::string message = absl::StrCat(path, ": ", what, ": ", std::strerror(e));
  if (e == ENOENT) return absl::NotFoundError(message);
  if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

int32_t ReadInt32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));  // the format is little-endian, as is every host we build for
  return v;
}

}  // namespace

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(path, "cannot open");
  struct stat st = {};
  if (fstat(fd, &st) != 0) {
    absl::Status s = ErrnoError(path, "cannot stat");
    ::close(fd);
    return s;
  }
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<size_t>(st.st_size);
  if (file.size_ > 0) {
    void* p = mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      absl::Status s = ErrnoError(path, "cannot mmap");
      ::close(fd);
      return s;
    }
    file.data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
}

absl::StatusOr<std::vector<std::string>> ExpandGlob(const std::string& pattern,
                                                    absl::string_view what) {
  glob_t g = {};
  const int rc = glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && paths.empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": '", pattern, "' matches no file on this worker"));
  }
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cannot expand '", pattern, "' (glob error ", rc, ")"));
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

absl::Status WriteTokenFile(const std::string& path, absl::Span<const int32_t> tokens) {
  std::vector<int32_t> header(kTokenFileHeaderInts, 0);
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  if (tokens.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", tokens.size(), " tokens do not fit one shard's int32 count"));
  }
  header[2] = static_cast<int32_t>(tokens.size());
  std::vector<uint16_t> body(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": token ", tokens[i], " at index ", i,
                                                     " does not fit uint16 [0, 65535]"));
    }
    body[i] = static_cast<uint16_t>(tokens[i]);
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return ErrnoError(path, "cannot create");
  bool ok = std::fwrite(header.data(), sizeof(int32_t), header.size(), f) == header.size();
  ok = ok && std::fwrite(body.data(), sizeof(uint16_t), body.size(), f) == body.size();
  if (std::fclose(f) != 0) ok = false;
  if (!ok) return ErrnoError(path, "write failed");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TokenData>> TokenData::Open(const TokenDataOptions& o) {
  if (o.seq_len < 1 || o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size ||
      o.vocab_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(o.field, ": bad loader options (seq_len ",
                                                   o.seq_len, ", rank ", o.rank, " of ",
                                                   o.world_size, ", vocab ", o.vocab_size, ")"));
  }
  absl::StatusOr<std::vector<std::string>> paths = ExpandGlob(o.glob, o.field);
  if (!paths.ok()) return paths.status();
  std::unique_ptr<TokenData> data(new TokenData(o));
  const uint64_t T = static_cast<uint64_t>(o.seq_len);
  uint64_t windows = 0;
  for (const std::string& path : *paths) {
    absl::StatusOr<MappedFile> file = MappedFile::Open(path);
    if (!file.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(o.field, ": ", file.status().message()));
    }
    const uint8_t* p = file->data();
    const size_t size = file->size();
    if (size < kTokenFileHeaderBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(o.field, ": ", path, ": truncated header: ", size,
                       " bytes, a shard starts with a ", kTokenFileHeaderBytes, "-byte header"));
    }
    const int32_t magic = ReadInt32(p), version = ReadInt32(p + 4), count = ReadInt32(p + 8);
    if (magic != kTokenFileMagic) {
      return absl::InvalidArgumentError(
          absl::StrCat(o.field, ": ", path, ": offset 0: magic ", magic, " is not ",
                       kTokenFileMagic, " (not an llm.c token shard; boulder-tokens writes them)"));
    }
    if (version != kTokenFileVersion) {
      return absl::InvalidArgumentError(absl::StrCat(o.field, ": ", path, ": offset 4: version ",
                                                     version, " is not ", kTokenFileVersion,
                                                     " (uint16 tokens)"));
    }
    if (count < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(o.field, ": ", path, ": offset 8: negative token count ", count));
    }
    const uint64_t expected = kTokenFileHeaderBytes + 2 * static_cast<uint64_t>(count);
    if (size != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          o.field, ": ", path, ": ", size, " bytes, but the header's token count ", count,
          " needs ", expected, size < expected ? " (truncated)" : " (trailing bytes)"));
    }
    const uint16_t* tokens = reinterpret_cast<const uint16_t*>(p + kTokenFileHeaderBytes);
    for (int64_t i = 0; i < count; ++i) {
      if (tokens[i] >= o.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            o.field, ": ", path, ": token ", tokens[i], " at token index ", i, " (byte offset ",
            kTokenFileHeaderBytes + 2 * i, ") is not below model.vocab_size ", o.vocab_size));
      }
    }
    data->num_tokens_ += static_cast<uint64_t>(count);
    if (static_cast<uint64_t>(count) >= T + 1) windows += (count - 1) / T;
    data->window_end_.push_back(windows);
    data->files_.push_back(std::move(*file));
  }
  const uint64_t world = static_cast<uint64_t>(o.world_size);
  const uint64_t rank = static_cast<uint64_t>(o.rank);
  data->num_windows_ = windows > rank ? (windows - rank + world - 1) / world : 0;
  if (data->num_windows_ == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.field, ": '", o.glob, "' (", data->num_tokens_, " tokens in ", paths->size(),
                     " files) has no window of seq_len + 1 = ", T + 1, " tokens for rank ", o.rank,
                     " of ", o.world_size));
  }
  return data;
}

const uint16_t* TokenData::Window(uint64_t k) const {
  const uint64_t g =
      static_cast<uint64_t>(options_.rank) + k * static_cast<uint64_t>(options_.world_size);
  const size_t file =
      std::upper_bound(window_end_.begin(), window_end_.end(), g) - window_end_.begin();
  const uint64_t first = file == 0 ? 0 : window_end_[file - 1];
  const uint64_t offset = (g - first) * static_cast<uint64_t>(options_.seq_len);
  return reinterpret_cast<const uint16_t*>(files_[file].data() + kTokenFileHeaderBytes) + offset;
}

const std::vector<uint64_t>& TokenData::Permutation(uint64_t epoch) {
  if (perm_epoch_ == epoch) return perm_;
  perm_.resize(num_windows_);
  for (uint64_t i = 0; i < num_windows_; ++i) perm_[i] = i;
  Rng rng(HashWords({options_.seed, static_cast<uint64_t>(options_.rank), epoch,
                     0x746F6B656E73ull /* "tokens" */}));
  for (uint64_t i = num_windows_; i > 1; --i) {  // Fisher-Yates
    const uint64_t j = rng.Below(i);
    std::swap(perm_[i - 1], perm_[j]);
  }
  perm_epoch_ = epoch;
  return perm_;
}

Batch TokenData::GetSamples(uint64_t first_sample, int B) {
  const int T = options_.seq_len;
  Batch batch;
  batch.inputs.resize(static_cast<size_t>(B) * T);
  batch.targets.resize(static_cast<size_t>(B) * T);
  for (int b = 0; b < B; ++b) {
    const uint64_t sample = first_sample + static_cast<uint64_t>(b);
    const uint64_t epoch = sample / num_windows_, i = sample % num_windows_;
    const uint64_t k = options_.shuffle ? Permutation(epoch)[i] : i;
    const uint16_t* w = Window(k);
    for (int t = 0; t < T; ++t) {
      batch.inputs[static_cast<size_t>(b) * T + t] = w[t];
      batch.targets[static_cast<size_t>(b) * T + t] = w[t + 1];
    }
  }
  return batch;
}

Batch TokenData::Get(int64_t step, int micro, int B, int grad_accum) {
  const uint64_t first =
      (static_cast<uint64_t>(step - 1) * grad_accum + static_cast<uint64_t>(micro)) * B;
  return GetSamples(first, B);
}

TokenDataPosition TokenData::PositionAt(int64_t step, int B, int grad_accum) const {
  const uint64_t sample = static_cast<uint64_t>(step - 1) * grad_accum * B;
  return TokenDataPosition{sample / num_windows_, sample % num_windows_};
}

std::vector<int32_t> TokenData::Prompt(int len) const {
  const uint16_t* w = Window(0);
  const int n = std::max(0, std::min(len, options_.seq_len + 1));
  return std::vector<int32_t>(w, w + n);
}

}  // namespace boulder::engine
