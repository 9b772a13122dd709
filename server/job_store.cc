#include "server/job_store.h"

#include <sqlite3.h>

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/time_util.h"

namespace boulder::server {
namespace {

using google::protobuf::util::TimeUtil;

constexpr int kSchemaVersion = 2;
constexpr int kBusyTimeoutMs = 5000;

constexpr char kSchema[] = R"sql(
CREATE TABLE jobs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL,
  state INTEGER NOT NULL,
  spec BLOB NOT NULL,
  message TEXT NOT NULL,
  create_time INTEGER NOT NULL,
  start_time INTEGER NOT NULL,
  end_time INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  workers TEXT NOT NULL,
  latest_report BLOB,
  generation BLOB);
CREATE INDEX jobs_by_state ON jobs(state, id);
CREATE TABLE job_events (
  job_id INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  time INTEGER NOT NULL,
  kind INTEGER NOT NULL,
  event BLOB NOT NULL,
  PRIMARY KEY (job_id, seq)) WITHOUT ROWID;
CREATE TABLE workers (
  id TEXT PRIMARY KEY,
  capabilities BLOB NOT NULL,
  state INTEGER NOT NULL,
  last_heartbeat INTEGER NOT NULL,
  register_time INTEGER NOT NULL,
  job_id INTEGER NOT NULL,
  rank INTEGER NOT NULL) WITHOUT ROWID;
PRAGMA user_version = 1;
)sql";

// Version 1 -> 2: jobs record the user who submitted them ('' for jobs from before, or from a
// coordinator without authentication).
constexpr char kMigrateTo2[] = R"sql(
ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT '';
CREATE INDEX jobs_by_owner ON jobs(owner, id);
PRAGMA user_version = 2;
)sql";

constexpr char kJobColumns[] =
    "id, name, state, spec, message, create_time, start_time, end_time, attempt, workers, "
    "latest_report, generation, owner";
// The owner is written once, at insert; kUpdateJob leaves it alone.
constexpr char kInsertJob[] =
    "INSERT INTO jobs (name, state, spec, message, create_time, start_time, end_time, attempt, "
    "workers, latest_report, generation, owner) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)";
constexpr char kUpdateJob[] =
    "UPDATE jobs SET name = ?1, state = ?2, spec = ?3, message = ?4, create_time = ?5, "
    "start_time = ?6, end_time = ?7, attempt = ?8, workers = ?9, latest_report = ?10, "
    "generation = ?11 WHERE id = ?12";
// Same columns as kJobColumns.
constexpr char kGetJob[] =
    "SELECT id, name, state, spec, message, create_time, start_time, end_time, attempt, "
    "workers, latest_report, generation, owner FROM jobs WHERE id = ?1";
constexpr char kCountJobs[] = "SELECT state, COUNT(*) FROM jobs GROUP BY state";
constexpr char kLastSeq[] = "SELECT COALESCE(MAX(seq), 0) FROM job_events WHERE job_id = ?1";
constexpr char kInsertEvent[] =
    "INSERT INTO job_events (job_id, seq, time, kind, event) VALUES (?1, ?2, ?3, ?4, ?5)";
constexpr char kListEvents[] =
    "SELECT event FROM job_events WHERE job_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3";
constexpr char kListEventsOfKind[] =
    "SELECT event FROM job_events WHERE job_id = ?1 AND seq > ?2 AND kind = ?4 ORDER BY seq "
    "LIMIT ?3";
constexpr char kPutWorker[] =
    "INSERT OR REPLACE INTO workers (id, capabilities, state, last_heartbeat, register_time, "
    "job_id, rank) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
constexpr char kListWorkers[] =
    "SELECT id, capabilities, state, last_heartbeat, register_time, job_id, rank FROM workers "
    "ORDER BY id";

int64_t Micros(const google::protobuf::Timestamp& t) {
  return TimeUtil::TimestampToMicroseconds(t);
}

// Resets a cached statement when it goes out of scope, so no statement stays mid-step and
// holds a read snapshot open.
class Reset {
 public:
  explicit Reset(sqlite3_stmt* s) : s_(s) {}
  ~Reset() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  Reset(const Reset&) = delete;
  Reset& operator=(const Reset&) = delete;

 private:
  sqlite3_stmt* s_;
};

void BindBlob(sqlite3_stmt* s, int i, const std::string& bytes) {
  sqlite3_bind_blob(s, i, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
}

void BindText(sqlite3_stmt* s, int i, const std::string& text) {
  sqlite3_bind_text(s, i, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
}

// A TEXT column; SQLite returns NULL for NULL values and on allocation failure.
std::string ColumnText(sqlite3_stmt* s, int i) {
  const unsigned char* p = sqlite3_column_text(s, i);
  return p == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(p));
}

bool ParseColumn(sqlite3_stmt* s, int i, google::protobuf::Message* m) {
  const void* p = sqlite3_column_blob(s, i);
  return m->ParseFromArray(p, sqlite3_column_bytes(s, i));
}

// Binds the job's columns in kInsertJob / kUpdateJob order (?1..?11).
void BindJob(sqlite3_stmt* s, const v1::Job& job) {
  BindText(s, 1, job.name());
  sqlite3_bind_int(s, 2, job.state());
  BindBlob(s, 3, job.spec().SerializeAsString());
  BindText(s, 4, job.message());
  sqlite3_bind_int64(s, 5, Micros(job.create_time()));
  sqlite3_bind_int64(s, 6, job.has_start_time() ? Micros(job.start_time()) : 0);
  sqlite3_bind_int64(s, 7, job.has_end_time() ? Micros(job.end_time()) : 0);
  sqlite3_bind_int(s, 8, job.attempt());
  BindText(s, 9, absl::StrJoin(job.workers(), "\n"));
  if (job.has_latest_report()) {
    BindBlob(s, 10, job.latest_report().SerializeAsString());
  } else {
    sqlite3_bind_null(s, 10);
  }
  if (job.has_generation()) {
    BindBlob(s, 11, job.generation().SerializeAsString());
  } else {
    sqlite3_bind_null(s, 11);
  }
}

// Reads a row selected with kJobColumns.
absl::StatusOr<v1::Job> ReadJob(sqlite3_stmt* s) {
  v1::Job job;
  job.set_id(sqlite3_column_int64(s, 0));
  job.set_name(ColumnText(s, 1));
  job.set_state(static_cast<v1::JobState>(sqlite3_column_int(s, 2)));
  if (!ParseColumn(s, 3, job.mutable_spec())) {
    return absl::DataLossError(absl::StrCat("job ", job.id(), ": corrupt spec column"));
  }
  job.set_message(ColumnText(s, 4));
  *job.mutable_create_time() = TimeUtil::MicrosecondsToTimestamp(sqlite3_column_int64(s, 5));
  if (int64_t us = sqlite3_column_int64(s, 6); us != 0) {
    *job.mutable_start_time() = TimeUtil::MicrosecondsToTimestamp(us);
  }
  if (int64_t us = sqlite3_column_int64(s, 7); us != 0) {
    *job.mutable_end_time() = TimeUtil::MicrosecondsToTimestamp(us);
  }
  job.set_attempt(sqlite3_column_int(s, 8));
  std::string workers = ColumnText(s, 9);
  for (absl::string_view w : absl::StrSplit(workers, '\n', absl::SkipEmpty())) {
    job.add_workers(std::string(w));
  }
  if (sqlite3_column_type(s, 10) != SQLITE_NULL &&
      !ParseColumn(s, 10, job.mutable_latest_report())) {
    return absl::DataLossError(absl::StrCat("job ", job.id(), ": corrupt latest_report"));
  }
  if (sqlite3_column_type(s, 11) != SQLITE_NULL && !ParseColumn(s, 11, job.mutable_generation())) {
    return absl::DataLossError(absl::StrCat("job ", job.id(), ": corrupt generation"));
  }
  job.set_owner(ColumnText(s, 12));
  return job;
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return absl::FailedPreconditionError(absl::StrCat("cannot open database ", path, ": ", msg));
  }
  std::unique_ptr<JobStore> store(new JobStore(db));
  absl::Status s = store->Init();
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("database ", path, ": ", s.message()));
  }
  return store;
}

JobStore::~JobStore() {
  for (auto& [sql, stmt] : statements_) sqlite3_finalize(stmt);
  sqlite3_close(db_);
}

absl::Status JobStore::Error(int rc, const char* what) const {
  std::string msg = absl::StrCat(what, ": ", sqlite3_errmsg(db_));
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_FULL:
      return absl::UnavailableError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status JobStore::Exec(const char* sql) {
  char* err = nullptr;
  int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &err);
  if (rc == SQLITE_OK) return absl::OkStatus();
  std::string msg = err != nullptr ? err : sqlite3_errstr(rc);
  sqlite3_free(err);
  if ((rc & 0xff) == SQLITE_BUSY) return absl::UnavailableError(msg);
  return absl::InternalError(msg);
}

absl::Status JobStore::Init() {
  // Exclusive locking mode before the first WAL access: SQLite then keeps the WAL index in
  // process memory and never releases the file lock, which is what keeps a second coordinator
  // out. No busy wait while taking the lock: its holder will not let go.
  sqlite3_busy_timeout(db_, 0);
  if (absl::Status s = Exec("PRAGMA locking_mode = EXCLUSIVE"); !s.ok()) return s;
  absl::Status s = Exec("PRAGMA journal_mode = WAL; BEGIN EXCLUSIVE; COMMIT;");
  if (absl::IsUnavailable(s)) {
    return absl::FailedPreconditionError("in use by another process (a second coordinator?)");
  }
  if (!s.ok()) return s;
  {
    auto mode = Prepare("PRAGMA journal_mode");
    if (!mode.ok()) return mode.status();
    Reset reset(*mode);
    if (sqlite3_step(*mode) != SQLITE_ROW || ColumnText(*mode, 0) != "wal") {
      return absl::FailedPreconditionError("cannot switch to WAL journal mode");
    }
  }
  if (absl::Status s = Exec("PRAGMA synchronous = FULL"); !s.ok()) return s;
  sqlite3_busy_timeout(db_, kBusyTimeoutMs);

  int version = 0;
  {
    auto v = Prepare("PRAGMA user_version");
    if (!v.ok()) return v.status();
    Reset reset(*v);
    if (sqlite3_step(*v) != SQLITE_ROW) return Error(SQLITE_ERROR, "reading user_version");
    version = sqlite3_column_int(*v, 0);
  }
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "schema version ", version, " is newer than this coordinator's (", kSchemaVersion, ")"));
  }
  if (version == 0) {
    if (absl::Status s = Transaction([&] { return Exec(kSchema); }); !s.ok()) return s;
    version = 1;
  }
  if (version == 1) {
    if (absl::Status s = Transaction([&] { return Exec(kMigrateTo2); }); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<sqlite3_stmt*> JobStore::Prepare(const char* sql) {
  auto it = statements_.find(sql);
  if (it != statements_.end()) return it->second;
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
  if (rc != SQLITE_OK) return Error(rc, "prepare");
  statements_.emplace(sql, stmt);
  return stmt;
}

absl::Status JobStore::Transaction(absl::FunctionRef<absl::Status()> body) {
  if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status s = body();
  if (s.ok()) s = Exec("COMMIT");
  if (!s.ok()) {
    // After a failed COMMIT SQLite may already have rolled back; ROLLBACK then fails
    // harmlessly.
    Exec("ROLLBACK").IgnoreError();
  }
  return s;
}

absl::StatusOr<int64_t> JobStore::InsertJob(const v1::Job& job) {
  auto s = Prepare(kInsertJob);
  if (!s.ok()) return s.status();
  Reset reset(*s);
  BindJob(*s, job);
  BindText(*s, 12, job.owner());
  if (int rc = sqlite3_step(*s); rc != SQLITE_DONE) return Error(rc, "insert job");
  return sqlite3_last_insert_rowid(db_);
}

absl::Status JobStore::UpdateJob(const v1::Job& job) {
  auto s = Prepare(kUpdateJob);
  if (!s.ok()) return s.status();
  Reset reset(*s);
  BindJob(*s, job);
  sqlite3_bind_int64(*s, 12, job.id());
  if (int rc = sqlite3_step(*s); rc != SQLITE_DONE) return Error(rc, "update job");
  if (sqlite3_changes(db_) == 0) {
    return absl::NotFoundError(absl::StrCat("job ", job.id(), " not found"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobStore::GetJob(int64_t id) {
  auto s = Prepare(kGetJob);
  if (!s.ok()) return s.status();
  Reset reset(*s);
  sqlite3_bind_int64(*s, 1, id);
  int rc = sqlite3_step(*s);
  if (rc == SQLITE_DONE) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  if (rc != SQLITE_ROW) return Error(rc, "get job");
  return ReadJob(*s);
}

absl::StatusOr<std::vector<v1::Job>> JobStore::ListJobs(const std::vector<v1::JobState>& states,
                                                        int limit, Order order,
                                                        const std::optional<std::string>& owner) {
  // The filter's arity varies, so this statement is prepared per call rather than cached.
  std::string sql = absl::StrCat("SELECT ", kJobColumns, " FROM jobs");
  std::vector<std::string> where;
  if (!states.empty()) {
    std::vector<std::string> marks(states.size(), "?");
    where.push_back(absl::StrCat("state IN (", absl::StrJoin(marks, ", "), ")"));
  }
  if (owner.has_value()) where.push_back("owner = ?");
  if (!where.empty()) absl::StrAppend(&sql, " WHERE ", absl::StrJoin(where, " AND "));
  absl::StrAppend(&sql, " ORDER BY id ", order == Order::kNewestFirst ? "DESC" : "ASC", " LIMIT ?");
  sqlite3_stmt* raw = nullptr;
  int rc = sqlite3_prepare_v2(db_, sql.c_str(), -1, &raw, nullptr);
  std::unique_ptr<sqlite3_stmt, int (*)(sqlite3_stmt*)> stmt(raw, sqlite3_finalize);
  if (rc != SQLITE_OK) return Error(rc, "prepare list jobs");
  int i = 1;
  for (v1::JobState state : states) sqlite3_bind_int(raw, i++, state);
  if (owner.has_value()) BindText(raw, i++, *owner);
  sqlite3_bind_int(raw, i, limit > 0 ? limit : -1);
  std::vector<v1::Job> jobs;
  while ((rc = sqlite3_step(raw)) == SQLITE_ROW) {
    auto job = ReadJob(raw);
    if (!job.ok()) return job.status();
    jobs.push_back(*std::move(job));
  }
  if (rc != SQLITE_DONE) return Error(rc, "list jobs");
  return jobs;
}

absl::StatusOr<std::map<v1::JobState, int64_t>> JobStore::CountJobsByState() {
  auto s = Prepare(kCountJobs);
  if (!s.ok()) return s.status();
  Reset reset(*s);
  std::map<v1::JobState, int64_t> counts;
  int rc;
  while ((rc = sqlite3_step(*s)) == SQLITE_ROW) {
    counts[static_cast<v1::JobState>(sqlite3_column_int(*s, 0))] = sqlite3_column_int64(*s, 1);
  }
  if (rc != SQLITE_DONE) return Error(rc, "count jobs");
  return counts;
}

absl::Status JobStore::AppendEvent(v1::JobEvent* event) {
  int64_t last = 0;
  {
    auto s = Prepare(kLastSeq);
    if (!s.ok()) return s.status();
    Reset reset(*s);
    sqlite3_bind_int64(*s, 1, event->job_id());
    if (int rc = sqlite3_step(*s); rc != SQLITE_ROW) return Error(rc, "last event seq");
    last = sqlite3_column_int64(*s, 0);
  }
  event->set_seq(last + 1);
  auto s = Prepare(kInsertEvent);
  if (!s.ok()) return s.status();
  Reset reset(*s);
  sqlite3_bind_int64(*s, 1, event->job_id());
  sqlite3_bind_int64(*s, 2, event->seq());
  sqlite3_bind_int64(*s, 3, Micros(event->time()));
  sqlite3_bind_int(*s, 4, event->kind_case());
  BindBlob(*s, 5, event->SerializeAsString());
  if (int rc = sqlite3_step(*s); rc != SQLITE_DONE) return Error(rc, "insert event");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::JobEvent>> JobStore::ListEvents(int64_t job_id, int64_t after_seq,
                                                               int limit,
                                                               v1::JobEvent::KindCase kind) {
  auto s = Prepare(kind == v1::JobEvent::KIND_NOT_SET ? kListEvents : kListEventsOfKind);
  if (!s.ok()) return s.status();
  Reset reset(*s);
  sqlite3_bind_int64(*s, 1, job_id);
  sqlite3_bind_int64(*s, 2, after_seq);
  sqlite3_bind_int(*s, 3, limit > 0 ? limit : -1);
  if (kind != v1::JobEvent::KIND_NOT_SET) sqlite3_bind_int(*s, 4, kind);
  std::vector<v1::JobEvent> events;
  int rc;
  while ((rc = sqlite3_step(*s)) == SQLITE_ROW) {
    v1::JobEvent& e = events.emplace_back();
    if (!ParseColumn(*s, 0, &e)) {
      return absl::DataLossError(absl::StrCat("job ", job_id, ": corrupt event"));
    }
  }
  if (rc != SQLITE_DONE) return Error(rc, "list events");
  return events;
}

absl::Status JobStore::PutWorker(const v1::Worker& worker) {
  auto s = Prepare(kPutWorker);
  if (!s.ok()) return s.status();
  Reset reset(*s);
  BindText(*s, 1, worker.id());
  BindBlob(*s, 2, worker.capabilities().SerializeAsString());
  sqlite3_bind_int(*s, 3, worker.state());
  sqlite3_bind_int64(*s, 4, Micros(worker.last_heartbeat()));
  sqlite3_bind_int64(*s, 5, Micros(worker.register_time()));
  sqlite3_bind_int64(*s, 6, worker.job_id());
  sqlite3_bind_int(*s, 7, worker.rank());
  if (int rc = sqlite3_step(*s); rc != SQLITE_DONE) return Error(rc, "put worker");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::Worker>> JobStore::ListWorkers() {
  auto s = Prepare(kListWorkers);
  if (!s.ok()) return s.status();
  Reset reset(*s);
  std::vector<v1::Worker> workers;
  int rc;
  while ((rc = sqlite3_step(*s)) == SQLITE_ROW) {
    v1::Worker& w = workers.emplace_back();
    w.set_id(ColumnText(*s, 0));
    if (!ParseColumn(*s, 1, w.mutable_capabilities())) {
      return absl::DataLossError(absl::StrCat("worker ", w.id(), ": corrupt capabilities"));
    }
    w.set_state(static_cast<v1::WorkerState>(sqlite3_column_int(*s, 2)));
    *w.mutable_last_heartbeat() = TimeUtil::MicrosecondsToTimestamp(sqlite3_column_int64(*s, 3));
    *w.mutable_register_time() = TimeUtil::MicrosecondsToTimestamp(sqlite3_column_int64(*s, 4));
    w.set_job_id(sqlite3_column_int64(*s, 5));
    w.set_rank(sqlite3_column_int(*s, 6));
  }
  if (rc != SQLITE_DONE) return Error(rc, "list workers");
  return workers;
}

}  // namespace boulder::server
