"""End-to-end for issue 10: token files, validation loss, weights out through the coordinator.

Writes shards of README.md with boulder-tokens, trains a small byte-level model on them through
a coordinator and a worker (127.0.0.1), checks the validation loss in `boulder get`, downloads
the weights with `boulder export`, and evaluates that file with `boulder-trainer --eval-only
--set model.init_from=...`: the loss must equal the job's final validation loss (same weights,
same tokens, FP32). A truncated shard fails the job before training with the file named, and
such a job has no weights to export.

Usage: tokens_e2e_test.py BIN_DIR REPO_DIR
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from harness import Cluster  # noqa: E402

BIN = REPO = None

SMALL = ["--set", "model.hidden=32", "--set", "model.heads=4", "--set", "model.layers=2",
         "--set", "model.ffn=128", "--set", "model.context=32", "--set", "training.seq_len=32",
         "--set", "training.batch_size=8", "--set", "training.steps=30",
         "--set", "training.warmup_steps=0", "--set", "eval.every_steps=10",
         "--set", "eval.batches=2", "--set", "generation.tokens=4"]


class TokensEndToEnd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="boulder-tokens-e2e-")
        cls.prefix = os.path.join(cls.tmp, "readme")
        out = subprocess.run([os.path.join(BIN, "boulder-tokens"), "--text",
                              os.path.join(REPO, "README.md"), "-o", cls.prefix,
                              "--val-tokens", "4096", "--shard-tokens", "8192"],
                             capture_output=True, text=True, check=True)
        assert "train tokens" in out.stdout, out.stdout
        cls.spec = os.path.join(REPO, "examples", "tokens-cpu.yaml")
        cls.data = ["--set", f"data.token_files={cls.prefix}_train_*.bin",
                    "--set", f"eval.token_files={cls.prefix}_val_*.bin"]
        cls.c = Cluster(BIN, workers=1)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_1_train_validate_export_and_reload(self):
        r = self.c.cli("submit", self.spec, *SMALL, *self.data, "-q")
        job_id = r.stdout.strip()
        w = self.c.cli("watch", job_id, timeout=240)
        self.assertIn("30/30", w.stdout)
        self.assertRegex(w.stdout, r"val \d+\.\d+")
        job = self.c.job(job_id)
        self.assertEqual(job["state"], "SUCCEEDED", job.get("message"))
        val = job["latest_report"]["val_loss"]
        self.assertLess(val, 5.0)  # ln(256) = 5.55 untrained
        self.assertIn("Val loss", self.c.cli("get", job_id).stdout)

        out = os.path.join(self.tmp, "model.safetensors")
        e = self.c.cli("export", job_id, "--format", "safetensors", "-o", out)
        self.assertIn("wrote", e.stdout)
        with open(out, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        self.assertEqual(header["transformer.wte.weight"]["shape"], [256, 32])
        self.assertEqual(header["transformer.h.1.attn.c_attn.weight"]["shape"], [32, 96])
        self.assertNotIn("lm_head.weight", header)  # tied

        ev = subprocess.run([os.path.join(BIN, "boulder-trainer"), "--spec", self.spec, *SMALL,
                             *self.data, "--set", f"model.init_from={out}", "--eval-only",
                             "--backend", "cpu", "--threads", "1"],
                            capture_output=True, text=True, timeout=120)
        self.assertEqual(ev.returncode, 0, ev.stdout + ev.stderr)
        m = re.search(r"val_loss (\d+\.\d+)", ev.stdout)
        self.assertIsNotNone(m, ev.stdout)
        self.assertAlmostEqual(float(m.group(1)), val, places=4)

    def test_2_truncated_shard_fails_before_training(self):
        bad = os.path.join(self.tmp, "bad")
        os.makedirs(bad)
        for name in os.listdir(self.tmp):
            if name.startswith("readme_train_"):
                shutil.copy(os.path.join(self.tmp, name), bad)
        victim = os.path.join(bad, "readme_train_000000.bin")
        with open(victim, "r+b") as f:
            f.truncate(os.path.getsize(victim) - 3)
        r = self.c.cli("submit", self.spec, *SMALL, *self.data, "--set",
                       f"data.token_files={bad}/readme_train_*.bin", "-q")
        job_id = r.stdout.strip()
        job = self.c.wait_state(job_id, ["FAILED", "SUCCEEDED"], 120)
        self.assertEqual(job["state"], "FAILED")
        self.assertIn(f"data.token_files: {victim}", job["message"])
        self.assertIn("(truncated)", job["message"])
        self.assertNotIn("latest_report", job)
        e = self.c.cli("export", job_id, "-o", os.path.join(self.tmp, "none.safetensors"),
                       check=False)
        self.assertEqual(e.returncode, 1)
        self.assertIn("has no weights yet", e.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "none.safetensors")))


if __name__ == "__main__":
    BIN, REPO = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
