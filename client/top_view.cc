#include "client/top_view.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/format.h"
#include "client/progress.h"
#include "client/table.h"
#include "client/views.h"

namespace boulder::client {
namespace {

// Whether the worker's latest report is of the job it runs now (not of its previous one).
bool ReportIsCurrent(const v1::Worker& w) {
  return w.state() == v1::WORKER_BUSY && w.job_id() > 0 && w.has_latest_report() &&
         (w.latest_report().job_id() == 0 || w.latest_report().job_id() == w.job_id());
}

std::string MemoryCell(const v1::Worker& w) {
  const int64_t device = w.capabilities().gpu_memory_bytes();
  if (ReportIsCurrent(w)) {
    const v1::MemoryStats& m = w.latest_report().memory();
    const int64_t total = m.device_total_bytes() > 0 ? m.device_total_bytes() : device;
    if (m.allocated_bytes() > 0) {
      return total > 0 ? absl::StrCat(HumanBytes(m.allocated_bytes()), " / ", HumanBytes(total))
                       : HumanBytes(m.allocated_bytes());
    }
  }
  return device > 0 ? absl::StrCat("- / ", HumanBytes(device)) : "-";
}

std::string StepTimeCell(const v1::Worker& w) {
  if (!ReportIsCurrent(w) || w.latest_report().step_time_seconds() <= 0) return "-";
  return StepTimeText(w.latest_report().step_time_seconds());
}

std::string Summary(const v1::ListWorkersResponse& workers, const v1::ListJobsResponse& jobs,
                    const TopViewOptions& options) {
  int busy = 0;
  int lost = 0;
  for (const v1::Worker& w : workers.workers()) {
    busy += w.state() == v1::WORKER_BUSY;
    lost += w.state() == v1::WORKER_LOST;
  }
  std::string worker_text = absl::StrCat("workers ", workers.workers_size(), " (", busy, " busy");
  if (lost > 0) absl::StrAppend(&worker_text, ", ", lost, " lost");
  worker_text += ")";
  int by_state[v1::JobState_ARRAYSIZE] = {};
  for (const v1::Job& j : jobs.jobs()) {
    if (j.state() >= 0 && j.state() < v1::JobState_ARRAYSIZE) ++by_state[j.state()];
  }
  std::vector<std::string> job_parts = {absl::StrCat(by_state[v1::RUNNING], " running"),
                                        absl::StrCat(by_state[v1::QUEUED], " queued")};
  if (by_state[v1::SCHEDULED] > 0) {
    job_parts.push_back(absl::StrCat(by_state[v1::SCHEDULED], " scheduled"));
  }
  if (by_state[v1::RESTARTING] > 0) {
    job_parts.push_back(absl::StrCat(by_state[v1::RESTARTING], " restarting"));
  }
  return absl::StrCat("boulder top  ", options.coordinator, "  ",
                      absl::FormatTime("%H:%M:%S", options.now, options.zone), "  ", worker_text,
                      "  jobs ", absl::StrJoin(job_parts, ", "));
}

std::string WorkerRows(const v1::ListWorkersResponse& workers) {
  if (workers.workers().empty()) return "no workers registered\n";
  Table table({"ID", "BACKEND", "GPU", "MEMORY", "STATE", "JOB", "STEP-TIME"});
  for (const v1::Worker& w : workers.workers()) {
    const v1::WorkerCapabilities& caps = w.capabilities();
    table.AddRow({w.id(), caps.backend().empty() ? "-" : caps.backend(), GpuText(caps),
                  MemoryCell(w), WorkerStateName(w.state()),
                  w.job_id() > 0 ? absl::StrCat(w.job_id()) : "-", StepTimeCell(w)});
  }
  return table.Render();
}

std::string JobRows(const v1::ListJobsResponse& jobs, int ended_jobs) {
  std::vector<const v1::Job*> active;
  std::vector<const v1::Job*> ended;
  for (const v1::Job& j : jobs.jobs()) (IsTerminal(j.state()) ? ended : active).push_back(&j);
  auto newest_first = [](const v1::Job* a, const v1::Job* b) { return a->id() > b->id(); };
  std::sort(active.begin(), active.end(), newest_first);
  std::sort(ended.begin(), ended.end(), newest_first);
  if (ended.size() > static_cast<size_t>(std::max(0, ended_jobs))) ended.resize(ended_jobs);
  if (active.empty() && ended.empty()) return "no jobs\n";
  Table table({"ID", "NAME", "STATE", "STEP", "LOSS"});
  for (const std::vector<const v1::Job*>* group : {&active, &ended}) {
    for (const v1::Job* j : *group) {
      const bool reported = j->has_latest_report() && j->latest_report().step() > 0;
      table.AddRow(
          {absl::StrCat(j->id()), j->name().empty() ? "-" : j->name(), JobStateName(j->state()),
           reported ? absl::StrCat(j->latest_report().step(), "/", j->latest_report().total_steps())
                    : "-",
           reported ? absl::StrFormat("%.4f", j->latest_report().loss()) : "-"});
    }
  }
  return table.Render();
}

// `line` cut to fewer than `width` display columns (code points); unchanged when width is 0.
std::string Fit(std::string line, int width) {
  if (width <= 0) return line;
  const size_t usable = static_cast<size_t>(std::max(0, width - 1));
  size_t columns = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    if ((static_cast<unsigned char>(line[i]) & 0xC0) == 0x80) continue;
    if (columns == usable) {
      line.resize(i);
      break;
    }
    ++columns;
  }
  return line;
}

}  // namespace

std::string RenderTop(const v1::ListWorkersResponse& workers, const v1::ListJobsResponse& jobs,
                      const TopViewOptions& options) {
  std::vector<std::string> lines = {Summary(workers, jobs, options)};
  if (!options.notice.empty()) lines.push_back(options.notice);
  lines.emplace_back();
  lines.emplace_back("WORKERS");
  for (absl::string_view l : absl::StrSplit(WorkerRows(workers), '\n', absl::SkipEmpty())) {
    lines.emplace_back(l);
  }
  lines.emplace_back();
  lines.emplace_back("JOBS");
  for (absl::string_view l :
       absl::StrSplit(JobRows(jobs, options.ended_jobs), '\n', absl::SkipEmpty())) {
    lines.emplace_back(l);
  }
  std::vector<std::string> footer;
  if (!options.footer.empty()) footer = {"", options.footer};
  if (options.height > 0) {
    const int room = std::max(0, options.height - 1 - static_cast<int>(footer.size()));
    if (static_cast<int>(lines.size()) > room) lines.resize(room);
  }
  std::string out;
  for (const std::vector<std::string>* part : {&lines, &footer}) {
    for (const std::string& l : *part) absl::StrAppend(&out, Fit(l, options.width), "\n");
  }
  return out;
}

}  // namespace boulder::client
