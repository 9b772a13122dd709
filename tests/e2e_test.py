"""End-to-end: coordinator, worker and CLI as separate processes on 127.0.0.1.

Submits a small config of the seed job, follows it to SUCCEEDED and checks that the loss fell
and that greedy generation keeps a constant stride; cancels a job mid-run; submits a bad spec;
runs the CLI against a coordinator that is not there.

Usage: e2e_test.py BIN_DIR REPO_DIR
"""
import json
import os
import socket
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import Cluster, wait_until  # noqa: E402

BIN = REPO = None

# The seed model shrunk to train in seconds on one core: same task, same code paths.
SMALL = ["--set", "model.hidden=64", "--set", "model.heads=4", "--set", "model.layers=2",
         "--set", "model.ffn=256", "--set", "model.context=32", "--set", "training.seq_len=32",
         "--set", "training.batch_size=8", "--set", "training.lr=0.003"]
# Arithmetic sequences are deterministic after the first two tokens, so a trained model's
# loss falls far below the uniform-guess loss ln(96) = 4.56. 0.5 leaves room for the first
# positions, where the stride is not yet known.
LOSS_THRESHOLD = 0.5


def constant_stride(prompt, tokens, vocab):
    seq = list(prompt) + list(tokens)
    diffs = {(b - a) % vocab for a, b in zip(seq, seq[1:])}
    return len(diffs) == 1


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EndToEnd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = Cluster(BIN, workers=1)
        cls.spec = os.path.join(REPO, "examples", "minigpt-cpu.yaml")

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def test_1_train_to_success(self):
        r = self.c.cli("submit", self.spec, *SMALL, "--set", "training.steps=250", "-q")
        job_id = r.stdout.strip()
        self.assertRegex(job_id, r"^\d+$")
        w = self.c.cli("watch", job_id, timeout=240)
        self.assertIn("250/250", w.stdout)
        job = self.c.job(job_id)
        self.assertEqual(job["state"], "SUCCEEDED", job.get("message"))
        self.assertLess(job["latest_report"]["loss"], LOSS_THRESHOLD)
        gen = job["generation"]
        self.assertEqual(len(gen["prompt"]), 8)
        self.assertEqual(len(gen["tokens"]), 16)
        self.assertTrue(constant_stride(gen["prompt"], gen["tokens"], 96), gen)
        # The worker is free again.
        workers = self.c.cli_json("workers")["workers"]
        self.assertEqual([w["state"] for w in workers], ["WORKER_IDLE"])
        # jobs lists it.
        jobs = self.c.cli_json("jobs")["jobs"]
        self.assertIn(job_id, [j["id"] for j in jobs])

    def test_2_cancel_mid_run(self):
        r = self.c.cli("submit", self.spec, *SMALL, "--set", "training.steps=1000000", "-q")
        job_id = r.stdout.strip()
        wait_until(lambda: int(self.c.job(job_id).get("latest_report", {}).get("step", 0)) >= 2,
                   120, f"job {job_id} to report steps")
        self.c.cli("cancel", job_id)
        job = self.c.wait_state(job_id, ["CANCELLED"], 30)
        self.assertEqual(job["state"], "CANCELLED")
        wait_until(lambda: [w["state"] for w in self.c.cli_json("workers")["workers"]] ==
                   ["WORKER_IDLE"], 30, "the worker to be idle again")
        w = self.c.cli("watch", job_id, check=False)
        self.assertEqual(w.returncode, 2, w.stdout + w.stderr)

    def test_3_bad_spec_names_the_field(self):
        r = self.c.cli("submit", self.spec, "--set", "model.heads=7", check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("model.heads: 7 does not divide hidden 768", r.stderr)
        r = self.c.cli("submit", self.spec, "--set", "training.stepz=3", check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("training.stepz", r.stderr)

    def test_4_no_coordinator(self):
        r = self.c.cli("jobs", address=f"127.0.0.1:{free_port()}", check=False, timeout=30)
        self.assertNotEqual(r.returncode, 0)
        lines = [l for l in r.stderr.splitlines()
                 if l.strip() and not l.startswith("boulder: WARNING: --insecure")]
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("cannot reach the coordinator", lines[0])


if __name__ == "__main__":
    BIN, REPO = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
