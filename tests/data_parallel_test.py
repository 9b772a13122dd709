"""Data parallelism end to end: a coordinator and three CPU workers (Gloo) on 127.0.0.1.

- A job with 2 workers and a job with 3 workers follow the loss curve of 1 worker with the same
  global batch (6 sequences per step), step by step, within LOSS_TOLERANCE; every rank
  reports the same (all-reduced) loss, and at the last step every rank reports the same
  parameter checksum (the trainers compare them and would fail the job otherwise).
- An emulated-FP8 job with 2 workers follows 1 worker's FP8 curve within FP8_LOSS_TOLERANCE,
  with the same parameter checksum on both ranks at the end.
- Killing one rank's trainer mid-run fails the job within KILL_DEADLINE seconds with the
  dead rank named, and leaves no trainer of the job running.

Step reports are read from the coordinator's SQLite store (job_events), decoding the protobuf
wire format by hand (this test needs no Python protobuf package). The coordinator holds its
database in exclusive locking mode, so the test stops it to read and then restarts it on the
same port (the workers re-register, as after any coordinator restart).

Usage: data_parallel_test.py BIN_DIR REPO_DIR
"""
import os
import signal
import struct
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import Cluster, decode, job_events, trainers_of, wait_until  # noqa: E402

BIN = REPO = None

GLOBAL_BATCH = 6
STEPS = 8
# A small model that trains in seconds on one core per worker. grad_accum 2 exercises the
# accumulation path: only the last micro-batch's backward all-reduces.
SMALL = ["--set", "model.hidden=32", "--set", "model.heads=2", "--set", "model.layers=2",
         "--set", "model.ffn=64", "--set", "model.context=16", "--set", "training.seq_len=16",
         "--set", "training.lr=0.003", "--set", "training.grad_accum_steps=2",
         "--set", "training.log_every_steps=1", "--set", "generation.tokens=0",
         "--set", "resources.checksum_every_steps=4",
         "--set", "resources.collective_timeout_seconds=20"]
# N ranks see exactly the sequences 1 worker sees; only the FP32 summation order differs
# (per-rank partial sums, then the all-reduce): differences of ~4e-8 measured over 12 steps
# (worker/engine/data_parallel_test.cc). A wrong data slice or a missing average moves the loss
# by 1e-2 or more.
LOSS_TOLERANCE = 1e-5
# Emulated FP8 (the ranks all-reduce their amaxes with MAX and agree on skipped steps; a rank's
# loss gradient is its share of the global mean, so its gradients are one worker's for the same
# rows and cast alike): the curves differ by FP32 summation order, amplified where a value lands
# on the other side of an FP8 rounding boundary: at most 1.9e-4 measured over 12 steps
# (worker/engine/data_parallel_test.cc, which also checks that the ranks' scales are identical).
FP8 = ["--set", "precision=fp8", "--set", "fp8.emulate=true"]
FP8_LOSS_TOLERANCE = 2e-3
# Collective timeout 10 s in the kill test: the job must be FAILED within this many seconds of
# the kill (the agent reports the killed trainer at once; the survivors' Gloo sees the closed
# connection at once, or times out after 10 s at worst; plus heartbeats and a loaded CI box).
KILL_DEADLINE = 30


def step_reports(db, job_id):
    """{rank: {step: (loss, param_checksum)}} from the job's stored StepReport events."""
    out = {}
    for event in job_events(db, job_id):
        if 5 not in event:  # JobEvent.step
            continue
        r = decode(event[5][0])
        rank = r.get(2, [0])[0]
        step = r.get(4, [0])[0]
        loss = struct.unpack("<d", r[6][0])[0] if 6 in r else 0.0
        checksum = struct.unpack("<Q", r[41][0])[0] if 41 in r else 0
        out.setdefault(rank, {})[step] = (loss, checksum)
    return out


class DataParallel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = Cluster(BIN, workers=3)
        cls.spec = os.path.join(REPO, "examples", "minigpt-cpu.yaml")

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def submit(self, *args):
        r = self.c.cli("submit", self.spec, *SMALL, *args, "-q")
        return int(r.stdout.strip())

    def run_job(self, workers, *extra):
        job_id = self.submit("--set", f"resources.workers={workers}",
                             "--set", f"training.batch_size={GLOBAL_BATCH // workers}",
                             "--set", f"training.steps={STEPS}", *extra)
        job = self.c.wait_state(job_id, {"SUCCEEDED", "FAILED", "CANCELLED"}, 240)
        self.assertEqual(job["state"], "SUCCEEDED", job.get("message"))
        self.assertEqual(len(job.get("workers", [])), workers)
        return job_id

    def read_reports(self, job_ids):
        """Stops the coordinator, reads the jobs' step reports, restarts it on its port."""
        port = int(self.c.address.rsplit(":", 1)[1])
        self.assertEqual(self.c.coordinator.stop(), 0)
        self.c.procs.remove(self.c.coordinator)
        try:
            return [step_reports(self.c.db, j) for j in job_ids]
        finally:
            self.c.start_coordinator(port)
            wait_until(lambda: sum(w.get("state") == "WORKER_IDLE" for w in
                                   self.c.cli_json("workers").get("workers", [])) == 3,
                       60, "the workers to register again")

    def test_two_and_three_workers_follow_the_one_worker_curve(self):
        jobs = [self.run_job(workers) for workers in (1, 2, 3)]
        all_reports = self.read_reports(jobs)
        single = all_reports[0][0]
        self.assertEqual(sorted(single), list(range(1, STEPS + 1)))
        for workers, reports in ((2, all_reports[1]), (3, all_reports[2])):
            self.assertEqual(sorted(reports), list(range(workers)), f"{workers} workers")
            final = {reports[r][STEPS][1] for r in range(workers)}
            self.assertEqual(len(final), 1, f"{workers} workers: checksums differ: {final}")
            self.assertNotEqual(final.pop(), 0, f"{workers} workers: no checksum at the end")
            for rank in range(workers):
                self.assertEqual(sorted(reports[rank]), list(range(1, STEPS + 1)))
                for step in range(1, STEPS + 1):
                    got, want = reports[rank][step][0], single[step][0]
                    self.assertAlmostEqual(
                        got, want, delta=LOSS_TOLERANCE,
                        msg=f"{workers} workers, rank {rank}, step {step}: {got} vs {want}")
                    self.assertEqual(got, reports[0][step][0], "ranks report different losses")

    def test_fp8_two_workers_follow_the_one_worker_curve(self):
        jobs = [self.run_job(workers, *FP8) for workers in (1, 2)]
        single, two = self.read_reports(jobs)
        self.assertEqual(sorted(two), [0, 1])
        final = {two[r][STEPS][1] for r in range(2)}
        self.assertEqual(len(final), 1, f"checksums differ: {final}")
        for rank in range(2):
            self.assertEqual(sorted(two[rank]), list(range(1, STEPS + 1)))
            for step in range(1, STEPS + 1):
                got, want = two[rank][step][0], single[0][step][0]
                self.assertAlmostEqual(got, want, delta=FP8_LOSS_TOLERANCE,
                                       msg=f"FP8 rank {rank}, step {step}: {got} vs {want}")

    def test_killing_one_trainer_fails_the_job_naming_the_rank(self):
        job_id = self.submit("--set", "resources.workers=2", "--set", "training.batch_size=3",
                             "--set", "training.steps=1000000",
                             "--set", "resources.collective_timeout_seconds=10",
                             # The failed attempt must end the job here (not restart it).
                             "--set", "max_restarts=0")
        wait_until(lambda: int(self.c.job(job_id).get("latest_report", {}).get("step", 0)) >= 3,
                   120, f"job {job_id} to report steps")
        victims = [pid for pid, rank in trainers_of(job_id) if rank == 1]
        self.assertEqual(len(victims), 1, trainers_of(job_id))
        killed_at = time.monotonic()
        os.kill(victims[0], signal.SIGKILL)
        job = self.c.wait_state(job_id, {"FAILED", "SUCCEEDED", "CANCELLED"}, KILL_DEADLINE)
        self.assertLess(time.monotonic() - killed_at, KILL_DEADLINE)
        self.assertEqual(job["state"], "FAILED")
        self.assertIn("rank 1", job.get("message", ""))
        print(f"\njob {job_id} failed {time.monotonic() - killed_at:.1f} s after the kill: "
              f"{job['message']}", file=sys.stderr)
        # The survivor is stopped too: no trainer of the job is left.
        wait_until(lambda: not trainers_of(job_id), 30, f"job {job_id}'s trainers to exit")
        # And the workers are free again for the next job.
        wait_until(lambda: all(w.get("state") == "WORKER_IDLE"
                               for w in self.c.cli_json("workers").get("workers", [])),
                   30, "all workers idle")


if __name__ == "__main__":
    BIN, REPO = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
