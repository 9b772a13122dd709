#include "worker/engine/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "worker/engine/crc32c.h"

namespace boulder::engine {
namespace {

constexpr char kMagic[8] = {'B', 'L', 'D', 'R', 'C', 'K', 'P', 'T'};
constexpr size_t kFixedHeader = 8 + 4 + 4 + 8;
constexpr size_t kEntryBytes = kCheckpointNameBytes + 8 + 8 + 4 + 4;
constexpr absl::string_view kPrefix = "ckpt-";
constexpr absl::string_view kSuffix = ".bin";
constexpr absl::string_view kTempMarker = ".tmp-";

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

absl::Status Errno(int err, absl::string_view what, absl::string_view path) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, " ", path));
}

absl::Status WriteAll(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno(errno, "writing", path);
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, char* data, size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::read(fd, data, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno(errno, "reading", path);
    if (n == 0) return absl::DataLossError(absl::StrCat(path, ": truncated"));
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno(errno, "opening directory", dir);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return Errno(err, "fsync of directory", dir);
  return absl::OkStatus();
}

std::string DirOf(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

// The step of a checkpoint file name, or -1.
int64_t StepOf(absl::string_view name) {
  if (name.find(kTempMarker) != absl::string_view::npos) return -1;
  if (!absl::ConsumePrefix(&name, kPrefix) || !absl::ConsumeSuffix(&name, kSuffix)) return -1;
  int64_t step = 0;
  if (name.empty() || !absl::SimpleAtoi(name, &step) || step < 0) return -1;
  return step;
}

}  // namespace

const std::string* CheckpointData::Find(absl::string_view name) const {
  for (const auto& [n, bytes] : sections) {
    if (n == name) return &bytes;
  }
  return nullptr;
}

std::string CheckpointFileName(int64_t step) { return absl::StrFormat("ckpt-%010d.bin", step); }

absl::Status WriteCheckpointFile(const std::string& path, int64_t step,
                                 const std::vector<CheckpointSectionRef>& sections) {
  if (sections.size() > kMaxCheckpointSections) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", sections.size(),
                                                   " sections, at most ", kMaxCheckpointSections));
  }
  std::set<std::string> names;
  for (const CheckpointSectionRef& s : sections) {
    if (s.name.empty() || s.name.size() >= kCheckpointNameBytes ||
        s.name.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint section name '", s.name,
                                                     "': must be 1 to ", kCheckpointNameBytes - 1,
                                                     " bytes"));
    }
    if (!names.insert(s.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint section '", s.name, "' given twice"));
    }
  }
  std::string header(kMagic, sizeof(kMagic));
  PutU32(&header, kCheckpointVersion);
  PutU32(&header, static_cast<uint32_t>(sections.size()));
  PutU64(&header, static_cast<uint64_t>(step));
  uint64_t offset = kFixedHeader + sections.size() * kEntryBytes + 4;
  for (const CheckpointSectionRef& s : sections) {
    std::string name(kCheckpointNameBytes, '\0');
    std::memcpy(name.data(), s.name.data(), s.name.size());
    header += name;
    PutU64(&header, offset);
    PutU64(&header, s.size);
    PutU32(&header, Crc32c(s.data, s.size));
    PutU32(&header, 0);
    offset += s.size;
  }
  PutU32(&header, Crc32c(header.data(), header.size()));

  const std::string tmp = absl::StrCat(path, kTempMarker, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno(errno, "creating", tmp);
  absl::Status status = WriteAll(fd, header.data(), header.size(), tmp);
  for (const CheckpointSectionRef& s : sections) {
    if (!status.ok()) break;
    status = WriteAll(fd, s.data, s.size, tmp);
  }
  if (status.ok() && ::fsync(fd) != 0) status = Errno(errno, "fsync of", tmp);
  if (::close(fd) != 0 && status.ok()) status = Errno(errno, "closing", tmp);
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = Errno(errno, absl::StrCat("renaming ", tmp, " to"), path);
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  return FsyncDir(DirOf(path));
}

absl::StatusOr<CheckpointData> ReadCheckpointFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno(errno, "opening", path);
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return Errno(errno, "stat of", path);
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  auto loss = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(path, ": ", what));
  };
  if (file_size < kFixedHeader + 4) {
    return loss(absl::StrCat("truncated: ", file_size, " bytes is shorter than a header"));
  }
  std::string header(kFixedHeader, '\0');
  if (absl::Status s = ReadAll(fd, header.data(), kFixedHeader, path); !s.ok()) return s;
  if (std::memcmp(header.data(), kMagic, sizeof(kMagic)) != 0) {
    return loss("not a checkpoint (bad magic)");
  }
  const uint32_t version = GetU32(header.data() + 8);
  if (version != kCheckpointVersion) {
    return loss(absl::StrCat("version ", version, ", this build reads ", kCheckpointVersion));
  }
  const uint32_t count = GetU32(header.data() + 12);
  if (count > kMaxCheckpointSections) {
    return loss(absl::StrCat(count, " sections in the header (corrupt)"));
  }
  const size_t table = count * kEntryBytes + 4;
  if (file_size < kFixedHeader + table) return loss("truncated inside the section table");
  header.resize(kFixedHeader + table);
  if (absl::Status s = ReadAll(fd, header.data() + kFixedHeader, table, path); !s.ok()) {
    return s;
  }
  const uint32_t header_crc = GetU32(header.data() + header.size() - 4);
  if (Crc32c(header.data(), header.size() - 4) != header_crc) {
    return loss("header checksum mismatch");
  }
  CheckpointData out;
  out.step = static_cast<int64_t>(GetU64(header.data() + 16));
  uint64_t expected_offset = kFixedHeader + table;
  std::vector<uint32_t> crcs;
  for (uint32_t i = 0; i < count; ++i) {
    const char* e = header.data() + kFixedHeader + i * kEntryBytes;
    const std::string name(e, strnlen(e, kCheckpointNameBytes));
    const uint64_t offset = GetU64(e + kCheckpointNameBytes);
    const uint64_t size = GetU64(e + kCheckpointNameBytes + 8);
    if (offset != expected_offset || size > file_size) {
      return loss(absl::StrCat("section ", name, ": bad offset or size"));
    }
    expected_offset += size;
    out.sections.emplace_back(name, std::string());
    crcs.push_back(GetU32(e + kCheckpointNameBytes + 16));
  }
  if (expected_offset != file_size) {
    return loss(absl::StrCat(expected_offset > file_size ? "truncated: " : "trailing bytes: ",
                             "header says ", expected_offset, " bytes, file has ", file_size));
  }
  for (uint32_t i = 0; i < count; ++i) {
    const char* e = header.data() + kFixedHeader + i * kEntryBytes;
    std::string& bytes = out.sections[i].second;
    bytes.resize(GetU64(e + kCheckpointNameBytes + 8));
    if (absl::Status s = ReadAll(fd, bytes.data(), bytes.size(), path); !s.ok()) return s;
    if (Crc32c(bytes.data(), bytes.size()) != crcs[i]) {
      return loss(absl::StrCat("section ", out.sections[i].first, ": checksum mismatch"));
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> ListCheckpoints(
    const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return out;
    return Errno(errno, "listing", dir);
  }
  while (const dirent* entry = ::readdir(d)) {
    const int64_t step = StepOf(entry->d_name);
    if (step >= 0) out.emplace_back(step, absl::StrCat(dir, "/", entry->d_name));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

absl::Status SaveCheckpoint(const std::string& dir, int64_t step,
                            const std::vector<CheckpointSectionRef>& sections, int keep_last) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("creating checkpoint directory ", dir, ": ", ec.message()));
  }
  absl::Status status =
      WriteCheckpointFile(absl::StrCat(dir, "/", CheckpointFileName(step)), step, sections);
  if (!status.ok()) return status;
  auto existing = ListCheckpoints(dir);
  if (!existing.ok()) return existing.status();
  for (size_t i = static_cast<size_t>(std::max(keep_last, 1)); i < existing->size(); ++i) {
    if (::unlink((*existing)[i].second.c_str()) != 0 && errno != ENOENT) {
      return Errno(errno, "removing old checkpoint", (*existing)[i].second);
    }
  }
  // Temporary files of writers that died mid-write.
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, kPrefix) && absl::StrContains(name, kTempMarker)) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<CheckpointData>> LoadLatestCheckpoint(
    const std::string& dir,
    const std::function<void(const std::string&, const absl::Status&)>& on_skip,
    std::string* loaded_path) {
  auto files = ListCheckpoints(dir);
  if (!files.ok()) return files.status();
  for (const auto& [step, path] : *files) {
    absl::StatusOr<CheckpointData> data = ReadCheckpointFile(path);
    if (data.ok()) {
      if (data->step != step) {
        const absl::Status s = absl::DataLossError(
            absl::StrCat(path, ": holds step ", data->step, " but is named for step ", step));
        if (on_skip) on_skip(path, s);
        continue;
      }
      if (loaded_path != nullptr) *loaded_path = path;
      return std::optional<CheckpointData>(*std::move(data));
    }
    if (!absl::IsDataLoss(data.status()) && !absl::IsNotFound(data.status())) {
      return data.status();
    }
    if (on_skip) on_skip(path, data.status());
  }
  return std::optional<CheckpointData>();
}

}  // namespace boulder::engine
