#include "client/views.h"

#include <cmath>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/format.h"
#include "client/generation.h"
#include "client/table.h"
#include "common/spec.h"

namespace boulder::client {
namespace {

constexpr v1::JobState kSelectableStates[] = {v1::QUEUED,    v1::SCHEDULED, v1::RUNNING,
                                              v1::SUCCEEDED, v1::FAILED,    v1::CANCELLED,
                                              v1::RESTARTING};

std::string StepCell(const v1::Job& job) {
  if (!job.has_latest_report() || job.latest_report().step() <= 0) return "-";
  return absl::StrCat(job.latest_report().step(), "/", job.latest_report().total_steps());
}

std::string LossCell(const v1::Job& job) {
  if (!job.has_latest_report() || job.latest_report().step() <= 0) return "-";
  return absl::StrFormat("%.4f", job.latest_report().loss());
}

std::string AgoOrDash(const google::protobuf::Timestamp& ts, absl::Time now) {
  absl::Time t = ToAbslTime(ts);
  if (t == absl::InfinitePast()) return "-";
  return absl::StrCat(ShortAge(now - t), " ago");
}

// Field label padded so that values line up.
std::string Field(absl::string_view label, absl::string_view value, int indent = 0) {
  return absl::StrFormat("%*s%-*s %s\n", indent, "", 13 - indent, absl::StrCat(label, ":"), value);
}

std::string Indent(absl::string_view text, int spaces) {
  std::string out;
  const std::string pad(spaces, ' ');
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty()) continue;
    absl::StrAppend(&out, pad, line, "\n");
  }
  return out;
}

// The figures a backend reports; a CPU trainer has no reserved pool or device total.
std::string MemoryText(const v1::MemoryStats& m) {
  std::vector<std::string> parts = {absl::StrCat("allocated ", HumanBytes(m.allocated_bytes()))};
  if (m.peak_bytes() > 0) parts.push_back(absl::StrCat("peak ", HumanBytes(m.peak_bytes())));
  if (m.reserved_bytes() > 0) {
    parts.push_back(absl::StrCat("reserved ", HumanBytes(m.reserved_bytes())));
  }
  if (m.device_total_bytes() > 0) {
    parts.push_back(absl::StrCat("device ", HumanBytes(m.device_total_bytes())));
  }
  return absl::StrJoin(parts, ", ");
}

std::string ReportText(const v1::StepReport& r) {
  std::string out;
  out += Field("Latest step", absl::StrCat(r.step(), "/", r.total_steps()));
  out += Field("Loss", absl::StrFormat("%.4f", r.loss()), 2);
  if (r.has_val_loss()) out += Field("Val loss", absl::StrFormat("%.4f", r.val_loss()), 2);
  out += Field("LR", Scientific(r.lr()), 2);
  out += Field("Grad norm", absl::StrFormat("%.4g", r.grad_norm()), 2);
  out += Field("Tokens/s", WithThousands(std::llround(r.tokens_per_second())), 2);
  out += Field("Step time", HumanDuration(absl::Seconds(r.step_time_seconds())), 2);
  const v1::MemoryStats& m = r.memory();
  if (m.allocated_bytes() > 0 || m.peak_bytes() > 0 || m.reserved_bytes() > 0 ||
      m.device_total_bytes() > 0) {
    out += Field("Memory", MemoryText(m), 2);
  }
  return out;
}

}  // namespace

std::string JobStateName(v1::JobState state) {
  if (state == v1::JOB_STATE_UNSPECIFIED) return "UNSPECIFIED";
  return v1::JobState_Name(state);
}

std::string WorkerStateName(v1::WorkerState state) {
  std::string name = v1::WorkerState_Name(state);
  constexpr absl::string_view kPrefix = "WORKER_";
  if (state == v1::WORKER_STATE_UNSPECIFIED) return "UNSPECIFIED";
  if (absl::StartsWith(name, kPrefix)) name.erase(0, kPrefix.size());
  return name;
}

absl::StatusOr<v1::JobState> ParseJobState(absl::string_view name) {
  std::string upper = absl::AsciiStrToUpper(name);
  std::vector<std::string> known;
  for (v1::JobState s : kSelectableStates) {
    if (v1::JobState_Name(s) == upper) return s;
    known.push_back(absl::AsciiStrToLower(v1::JobState_Name(s)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown job state '", name, "' (one of ", absl::StrJoin(known, ", "), ")"));
}

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

std::string JobsTable(const v1::ListJobsResponse& jobs, absl::Time now) {
  Table table({"ID", "NAME", "STATE", "STEP", "LOSS", "WORKERS", "AGE"});
  for (const v1::Job& job : jobs.jobs()) {
    table.AddRow({absl::StrCat(job.id()), job.name().empty() ? "-" : job.name(),
                  JobStateName(job.state()), StepCell(job), LossCell(job),
                  job.workers().empty() ? "-" : absl::StrJoin(job.workers(), ","),
                  ToAbslTime(job.create_time()) == absl::InfinitePast()
                      ? "-"
                      : ShortAge(now - ToAbslTime(job.create_time()))});
  }
  return table.Render();
}

std::string GpuText(const v1::WorkerCapabilities& caps) {
  if (caps.gpu_name().empty()) return "-";
  if (caps.compute_capability_major() <= 0) return caps.gpu_name();
  return absl::StrCat(caps.gpu_name(), " (sm_", caps.compute_capability_major(),
                      caps.compute_capability_minor(), ")");
}

std::string WorkersTable(const v1::ListWorkersResponse& workers, absl::Time now) {
  Table table({"ID", "BACKEND", "CORES", "GPU", "MEMORY", "STATE", "JOB", "LAST-HEARTBEAT"});
  for (const v1::Worker& w : workers.workers()) {
    const v1::WorkerCapabilities& caps = w.capabilities();
    table.AddRow({w.id(), caps.backend().empty() ? "-" : caps.backend(),
                  caps.cpu_cores() > 0 ? absl::StrCat(caps.cpu_cores()) : "-", GpuText(caps),
                  caps.gpu_memory_bytes() > 0 ? HumanBytes(caps.gpu_memory_bytes()) : "-",
                  WorkerStateName(w.state()), w.job_id() > 0 ? absl::StrCat(w.job_id()) : "-",
                  AgoOrDash(w.last_heartbeat(), now)});
  }
  return table.Render();
}

std::string JobDetails(const v1::Job& job, absl::Time now, absl::TimeZone zone) {
  std::string out;
  out += Field("ID", absl::StrCat(job.id()));
  out += Field("Name", job.name().empty() ? "-" : job.name());
  out += Field("State", JobStateName(job.state()));
  if (!job.message().empty()) out += Field("Message", job.message());

  const absl::Time created = ToAbslTime(job.create_time());
  const absl::Time started = ToAbslTime(job.start_time());
  const absl::Time ended = ToAbslTime(job.end_time());
  std::string created_text = FormatTimestamp(job.create_time(), zone);
  if (created != absl::InfinitePast()) {
    absl::StrAppend(&created_text, " (", ShortAge(now - created), " ago)");
  }
  out += Field("Created", created_text);
  out += Field("Started", FormatTimestamp(job.start_time(), zone));
  std::string ended_text = FormatTimestamp(job.end_time(), zone);
  if (started != absl::InfinitePast() && ended != absl::InfinitePast()) {
    absl::StrAppend(&ended_text, " (ran ", HumanDuration(ended - started), ")");
  }
  out += Field("Ended", ended_text);
  out += Field("Attempt", absl::StrCat(job.attempt()));
  out += Field("Workers", job.workers().empty() ? "-" : absl::StrJoin(job.workers(), ", "));

  if (job.has_latest_report() && job.latest_report().step() > 0) {
    out += ReportText(job.latest_report());
  } else {
    out += Field("Latest step", "-");
  }

  if (job.has_spec()) {
    out += "Spec:\n";
    out += Indent(common::JobSpecToYaml(job.spec()), 2);
  }

  const v1::GenerationResult& gen = job.generation();
  if (!gen.tokens().empty()) {
    const int64_t vocab = job.spec().model().vocab_size();
    out += "Generation:\n";
    out += Field("Prompt", JoinTokens(gen.prompt(), 0), 2);
    out += Field("Generated", JoinTokens(gen.tokens(), 0), 2);
    out += absl::StrCat("  ", StrideVerdict(gen, vocab), "\n");
  }
  return out;
}

}  // namespace boulder::client
