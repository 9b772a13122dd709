// JobStore: the coordinator's durable state in one SQLite file: jobs, their events (state
// changes, step reports, log lines, generation results) and worker registrations.
//
// Durability: WAL journal with synchronous=FULL, so a transaction that Transaction() reported
// committed survives a crash of the process or the machine. The file is opened in exclusive
// locking mode: a second coordinator on the same file fails at Open instead of scheduling the
// same jobs twice.
//
// Schema (PRAGMA user_version 2; a version-1 file is migrated at Open):
//   jobs(id INTEGER PRIMARY KEY AUTOINCREMENT, name, state, spec BLOB (JobSpec), message,
//        create_time, start_time, end_time (unix microseconds, 0 = unset), attempt,
//        workers (worker ids by rank, '\n'-separated), latest_report BLOB (StepReport),
//        generation BLOB (GenerationResult), owner (the submitting user; '' without auth))
//   job_events(job_id, seq, time, kind, event BLOB (JobEvent), PRIMARY KEY(job_id, seq))
//   workers(id PRIMARY KEY, capabilities BLOB, state, last_heartbeat, register_time, job_id,
//           rank)
// AUTOINCREMENT keeps job ids unique forever, even after the newest job row is gone.
//
// Thread-compatible, not thread-safe: one connection, callers serialize all calls (the
// Coordinator holds its mutex around every use).
//
// Errors: INTERNAL for SQLite failures (with SQLite's message), UNAVAILABLE when the database
// is busy or the disk is full (a retry may work), NOT_FOUND for unknown ids,
// FAILED_PRECONDITION at Open for a file that cannot be opened, a newer schema or a file held
// by another coordinator.
#ifndef BOULDER_SERVER_JOB_STORE_H_
#define BOULDER_SERVER_JOB_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "boulder/v1/job.pb.h"
#include "boulder/v1/worker.pb.h"

struct sqlite3;
struct sqlite3_stmt;

namespace boulder::server {

class JobStore {
 public:
  // Which rows ListJobs returns first.
  enum class Order { kNewestFirst, kOldestFirst };

  // Opens `path`, creating the file and schema if needed.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);

  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Runs `body` in one write transaction: committed if it returns OK, rolled back otherwise
  // (its error is returned). Not reentrant. Calls outside a transaction commit on their own.
  absl::Status Transaction(absl::FunctionRef<absl::Status()> body);

  // Inserts `job` (its id is ignored; its owner is kept for good) and returns the id SQLite
  // assigned: 1, 2, 3...
  absl::StatusOr<int64_t> InsertJob(const v1::Job& job);

  // Overwrites the row of job `job.id()`. NOT_FOUND if there is none.
  absl::Status UpdateJob(const v1::Job& job);

  // NOT_FOUND "job 42 not found".
  absl::StatusOr<v1::Job> GetJob(int64_t id);

  // Jobs in any of `states` (all when empty), at most `limit` (all when 0), only those of
  // `owner` when it is given.
  absl::StatusOr<std::vector<v1::Job>> ListJobs(const std::vector<v1::JobState>& states, int limit,
                                                Order order,
                                                const std::optional<std::string>& owner = {});

  // Job counts by state (states without jobs are absent).
  absl::StatusOr<std::map<v1::JobState, int64_t>> CountJobsByState();

  // Appends `event` to its job's log: sets event->seq to one past the job's last event (1 for
  // the first). event->job_id and event->time must be set by the caller.
  absl::Status AppendEvent(v1::JobEvent* event);

  // The job's events with seq > after_seq in seq order, at most `limit` (all when 0); only
  // those of `kind` when it is not KIND_NOT_SET.
  absl::StatusOr<std::vector<v1::JobEvent>> ListEvents(
      int64_t job_id, int64_t after_seq, int limit,
      v1::JobEvent::KindCase kind = v1::JobEvent::KIND_NOT_SET);

  // Inserts or overwrites the worker's row (latest_report is not stored here: step reports
  // live with their job).
  absl::Status PutWorker(const v1::Worker& worker);

  // Every worker row, ordered by id.
  absl::StatusOr<std::vector<v1::Worker>> ListWorkers();

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  absl::Status Init();
  // Prepares `sql` once and caches it; the statement is reset and its bindings cleared.
  absl::StatusOr<sqlite3_stmt*> Prepare(const char* sql);
  absl::Status Exec(const char* sql);
  absl::Status Error(int rc, const char* what) const;

  sqlite3* db_;
  std::map<const char*, sqlite3_stmt*> statements_;
};

}  // namespace boulder::server

#endif  // BOULDER_SERVER_JOB_STORE_H_
