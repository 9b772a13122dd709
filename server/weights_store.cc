#include "server/weights_store.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace boulder::server {
namespace {

absl::Status IoError(const std::string& path, absl::string_view what) {
  return absl::InternalError(absl::StrCat(path, ": ", what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<WeightsStore>> WeightsStore::Open(
    const WeightsStoreOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("weights dir: a path is required");
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("weights dir ", options.dir, ": cannot create: ", ec.message()));
  }
  return std::unique_ptr<WeightsStore>(new WeightsStore(options));
}

std::string WeightsStore::FinalPath(int64_t job_id) const {
  return absl::StrCat(options_.dir, "/job-", job_id, ".safetensors");
}

std::string WeightsStore::PartPath(int64_t job_id, int32_t attempt) const {
  return absl::StrCat(options_.dir, "/job-", job_id, ".attempt-", attempt, ".part");
}

absl::StatusOr<int64_t> WeightsStore::Append(int64_t job_id, int32_t attempt, int64_t total_bytes,
                                             int64_t offset, absl::string_view data, bool last) {
  if (static_cast<int64_t>(data.size()) > kMaxWeightsChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("weights chunk of ", data.size(),
                                                   " bytes is over the ", kMaxWeightsChunkBytes,
                                                   "-byte limit"));
  }
  if (total_bytes < 0 || total_bytes > options_.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("weights of ", total_bytes,
                                                   " bytes: the coordinator accepts at most ",
                                                   options_.max_bytes));
  }
  absl::MutexLock lock(&mu_);
  Upload& up = uploads_[job_id];
  const std::string part = PartPath(job_id, attempt);
  if (offset == 0) {
    if (up.received > 0 && up.attempt != attempt) std::remove(PartPath(job_id, up.attempt).c_str());
    up = Upload{attempt, total_bytes, 0};
    FILE* f = std::fopen(part.c_str(), "wb");
    if (f == nullptr) return IoError(part, "cannot create");
    std::fclose(f);
  } else if (up.attempt != attempt || offset != up.received) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " attempt ", attempt, ": upload expected at offset ",
                     up.attempt == attempt ? up.received : 0, ", got ", offset));
  }
  if (total_bytes != up.total_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job_id, ": total_bytes changed from ",
                                                   up.total_bytes, " to ", total_bytes));
  }
  if (up.received + static_cast<int64_t>(data.size()) > total_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job_id, ": chunk at ", offset, " of ",
                                                   data.size(), " bytes runs past total_bytes ",
                                                   total_bytes));
  }
  FILE* f = std::fopen(part.c_str(), "ab");
  if (f == nullptr) return IoError(part, "cannot open");
  const bool wrote = std::fwrite(data.data(), 1, data.size(), f) == data.size();
  if (std::fclose(f) != 0 || !wrote) return IoError(part, "write failed");
  up.received += static_cast<int64_t>(data.size());
  if (last) {
    if (up.received != total_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("job ", job_id, ": last chunk leaves ",
                                                     up.received, " of ", total_bytes, " bytes"));
    }
    if (std::rename(part.c_str(), FinalPath(job_id).c_str()) != 0) {
      return IoError(part, "cannot rename");
    }
    const int64_t received = up.received;
    uploads_.erase(job_id);
    return received;
  }
  return up.received;
}

absl::StatusOr<WeightsStore::Chunk> WeightsStore::Read(int64_t job_id, int64_t offset,
                                                       int64_t max_bytes) {
  if (max_bytes <= 0) max_bytes = kDefaultWeightsChunkBytes;
  max_bytes = std::min(max_bytes, kMaxWeightsChunkBytes);
  const std::string path = FinalPath(job_id);
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("job ", job_id, ": no weights"));
    return IoError(path, "cannot open");
  }
  Chunk chunk;
  std::fseek(f, 0, SEEK_END);
  chunk.total_bytes = std::ftell(f);
  if (offset < 0 || offset > chunk.total_bytes) {
    std::fclose(f);
    return absl::OutOfRangeError(absl::StrCat("offset ", offset, " is outside the ",
                                              chunk.total_bytes, "-byte weights file"));
  }
  std::fseek(f, offset, SEEK_SET);
  chunk.data.resize(std::min(max_bytes, chunk.total_bytes - offset));
  const size_t n = std::fread(chunk.data.data(), 1, chunk.data.size(), f);
  std::fclose(f);
  if (n != chunk.data.size()) return IoError(path, "short read");
  return chunk;
}

}  // namespace boulder::server
