"""bench/multi_gpu.py (issue 9) on the CPU backend: its mechanics, not a GPU measurement.

Runs the scaling script with 1 and 2 CPU workers (Gloo) on the tiny cpu-small workload and
checks what it wrote: a timed row per worker count with positive ms/step and tokens/s/GPU,
efficiency 1 at N=1, the 2-vs-1-worker loss pair within the script's fp32 tolerance, and a kill
test that failed the job within its deadline leaving no trainer. The script itself exits
non-zero on any of these failing; this test also reads its JSON so a silently empty run fails.

Usage: multi_gpu_bench_test.py BIN_DIR REPO_DIR
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

BIN = REPO = None


class MultiGpuBenchOnCpu(unittest.TestCase):
    def test_cpu_mechanics(self):
        with tempfile.TemporaryDirectory(prefix="mgpu-test-") as out:
            r = subprocess.run(
                [sys.executable, os.path.join(REPO, "bench", "multi_gpu.py"), "--bin", BIN,
                 "--backend", "cpu", "--workloads", "cpu-small", "--gpus", "1 2",
                 "--steps", "6", "--warmup", "2", "--collective-timeout", "10",
                 "--job-timeout", "120", "--commit", "test", "--out", out],
                capture_output=True, text=True, timeout=170, stdin=subprocess.DEVNULL)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            with open(os.path.join(out, "multi-gpu.json")) as f:
                result = json.load(f)
            with open(os.path.join(out, "multi-gpu.md")) as f:
                md = f.read()
        self.assertIn("| cpu-small | fp32 | 2 |", md)
        self.assertIn("commit: test", md)
        rows = {row["workers"]: row for row in result["rows"]}
        self.assertEqual(sorted(rows), [1, 2])
        for n, row in rows.items():
            self.assertNotIn("error", row, row)
            self.assertGreater(row["ms_per_step"], 0, row)
            self.assertGreater(row["tokens_per_s_per_gpu"], 0, row)
            self.assertEqual(len(row["loss"]), 6, row)
        self.assertEqual(rows[1]["efficiency"], 1.0)
        self.assertGreater(rows[2]["efficiency"], 0)
        self.assertLessEqual(rows[2]["loss_max_diff"], rows[2]["loss_tolerance"])
        self.assertEqual(rows[2]["loss_tolerance"], 1e-5)
        kill = result["kill_test"]
        self.assertTrue(kill["ok"], kill)
        self.assertEqual(kill["state"], "FAILED")
        self.assertIn("rank 1", kill["message"])
        self.assertLess(kill["seconds"], kill["deadline_s"])
        self.assertEqual(kill["leftover_trainers"], [])


if __name__ == "__main__":
    BIN, REPO = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
