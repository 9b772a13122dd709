"""Reliability end to end: checkpoints, restarts and a crash-safe coordinator, with real
processes on 127.0.0.1.

- A worker SIGKILLed mid-job (agent and trainer): the job goes RESTARTING, is placed on the
  other worker, resumes from its checkpoint and ends with exactly the loss of an uninterrupted
  run of the same spec.
- The coordinator SIGKILLed mid-job and restarted on the same database and port: `boulder
  jobs` lists every job, the running job completes (its trainer kept running and reattached),
  and a job acknowledged just before the kill is there and runs.
- A corrupt latest checkpoint is skipped, with a warning in the job's log, for the previous
  one; the run still ends with the uninterrupted run's loss.

Usage: reliability_test.py BIN_DIR REPO_DIR
"""
import os
import shutil
import signal
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import Cluster, wait_until  # noqa: E402

BIN = REPO = None

# A small model with steps slow enough (tens of ms on one core) to be caught mid-run.
SMALL = ["--set", "model.hidden=64", "--set", "model.heads=4", "--set", "model.layers=2",
         "--set", "model.ffn=256", "--set", "model.context=32", "--set", "training.seq_len=32",
         "--set", "training.batch_size=8", "--set", "training.lr=0.003",
         "--set", "generation.tokens=0", "--set", "training.log_every_steps=1"]


def trainer_pid_for(worker, job_id):
    """The pid of the trainer the agent started for `job_id` (from the agent's log)."""
    m = worker.wait_line(rf"job {job_id} attempt \d+.*started trainer, pid (\d+)", 60)
    return int(m.group(1))


def kill_pid(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Reliability(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="boulder-ckpt-")
        self.spec = os.path.join(REPO, "examples", "minigpt-cpu.yaml")
        self.c = None

    def tearDown(self):
        if self.c:
            self.c.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def cluster(self, workers, heartbeat_timeout_ms=3000):
        # A short heartbeat timeout so a lost worker is noticed within seconds.
        self.c = Cluster(BIN, workers=workers,
                         worker_args=["--checkpoint-root", self.root],
                         coordinator_args=["--heartbeat-timeout-ms", str(heartbeat_timeout_ms),
                                           "--heartbeat-interval-ms", "200"])
        return self.c

    def submit(self, *extra):
        r = self.c.cli("submit", self.spec, *SMALL, *extra, "-q")
        return r.stdout.strip()

    def step(self, job_id):
        return int(self.c.job(job_id).get("latest_report", {}).get("step", 0))

    def logs(self, job_id):
        return self.c.cli("logs", job_id).stdout

    def events_states(self, job_id):
        """What `boulder watch` prints for a finished job: every state change, replayed."""
        w = self.c.cli("watch", job_id, check=False, timeout=120)
        return w.stdout

    def test_1_worker_killed_mid_job_restarts_elsewhere_with_the_same_loss(self):
        c = self.cluster(workers=2)
        steps = ["--set", "training.steps=300", "--set", "checkpoint.every_steps=20"]
        # The reference goes to the first worker, the job under test to the second.
        ref = self.submit(*steps, "--set", "checkpoint.dir=reference")
        job = self.submit(*steps, "--set", "max_restarts=2")
        victim = c.worker_procs[1]
        pid = trainer_pid_for(victim, job)
        wait_until(lambda: self.step(job) >= 45, 120, f"job {job} to pass step 45")
        self.assertLess(self.step(job), 300, "killed too late to test a restart")
        kill_pid(pid)
        victim.kill(signal.SIGKILL)

        c.wait_state(ref, ["SUCCEEDED"], 180)
        done = c.wait_state(job, ["SUCCEEDED", "FAILED"], 180)
        self.assertEqual(done["state"], "SUCCEEDED", done.get("message"))
        self.assertEqual(done["attempt"], 2)
        workers = c.cli_json("workers")["workers"]
        survivors = [w["id"] for w in workers if w["state"] != "WORKER_LOST"]
        self.assertEqual(len(workers), 2)
        self.assertEqual(done["workers"], survivors)
        want = c.job(ref)["latest_report"]
        got = done["latest_report"]
        self.assertEqual(got["step"], want["step"])
        # Bit for bit: the JSON carries the double's shortest exact representation.
        self.assertEqual(got["loss"], want["loss"])
        log = self.logs(job)
        self.assertRegex(log, r"resumed from checkpoint .*/job-%s/ckpt-\d+\.bin at step \d+ "
                         r"of 300" % job)
        watch = self.events_states(job)
        self.assertIn("RESTARTING", watch)
        self.assertRegex(watch, r"RESTARTING.*attempt 1 failed: .*restart 1 of 2")

    def test_2_coordinator_killed_mid_job_loses_nothing(self):
        # The restarted coordinator gives workers this long to come back with their trainers.
        c = self.cluster(workers=1, heartbeat_timeout_ms=8000)
        before = self.submit("--set", "training.steps=20")
        c.wait_state(before, ["SUCCEEDED"], 120)
        running = self.submit("--set", "training.steps=400", "--set", "checkpoint.every_steps=50")
        wait_until(lambda: self.step(running) >= 10, 120, f"job {running} to run")
        queued = self.submit("--set", "training.steps=20")  # acknowledged: it has an id
        port = int(c.address.rsplit(":", 1)[1])
        c.coordinator.kill(signal.SIGKILL)
        c.coordinator.p.wait(10)
        c.start_coordinator(port=port)

        ids = [j["id"] for j in c.cli_json("jobs")["jobs"]]
        self.assertEqual(sorted(ids, key=int), sorted([before, running, queued], key=int))
        self.assertEqual(c.job(before)["state"], "SUCCEEDED")
        done = c.wait_state(running, ["SUCCEEDED", "FAILED"], 240)
        self.assertEqual(done["state"], "SUCCEEDED", done.get("message"))
        # The trainer kept running through the outage and reattached: no second attempt.
        self.assertEqual(done["attempt"], 1)
        self.assertEqual(done["latest_report"]["step"], "400")
        q = c.wait_state(queued, ["SUCCEEDED", "FAILED"], 120)
        self.assertEqual(q["state"], "SUCCEEDED", q.get("message"))
        # The history survived: every state change of the first job is still there.
        watch = self.events_states(before)
        for state in ("QUEUED", "SCHEDULED", "RUNNING", "SUCCEEDED"):
            self.assertIn(state, watch)

    def test_3_corrupt_latest_checkpoint_is_skipped_with_a_warning(self):
        c = self.cluster(workers=1)
        steps = ["--set", "training.steps=50", "--set", "checkpoint.every_steps=10",
                 "--set", "checkpoint.keep_last=3", "--set", "checkpoint.dir=shared-run"]
        first = self.submit(*steps)
        first_done = c.wait_state(first, ["SUCCEEDED", "FAILED"], 120)
        self.assertEqual(first_done["state"], "SUCCEEDED", first_done.get("message"))
        ckpt_dir = os.path.join(self.root, "shared-run")
        files = sorted(f for f in os.listdir(ckpt_dir) if f.endswith(".bin"))
        self.assertEqual(files, ["ckpt-0000000020.bin", "ckpt-0000000030.bin",
                                 "ckpt-0000000040.bin"])
        latest = os.path.join(ckpt_dir, files[-1])
        with open(latest, "r+b") as f:
            f.seek(-100, os.SEEK_END)
            byte = f.read(1)
            f.seek(-100, os.SEEK_END)
            f.write(bytes([byte[0] ^ 0xFF]))

        # The same spec and directory: resumes from step 30, not the corrupt 40.
        second = self.submit(*steps)
        done = c.wait_state(second, ["SUCCEEDED", "FAILED"], 120)
        self.assertEqual(done["state"], "SUCCEEDED", done.get("message"))
        log = self.logs(second)
        self.assertIn(f"warning: checkpoint {latest} is corrupt", log)
        self.assertIn("checksum mismatch", log)
        self.assertIn("at step 30 of 50", log)
        self.assertEqual(done["latest_report"]["loss"], first_done["latest_report"]["loss"])


if __name__ == "__main__":
    BIN, REPO = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
