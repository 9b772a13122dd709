"""The CLI's terminal views against a real coordinator and worker (issue 6).

`boulder watch JOB` runs in a pseudo-terminal of 100x30 and must draw the progress bar, the
braille loss chart under it (redrawn in place with cursor movement) and the per-rank step
times; `boulder top` runs in one too and quits on 'q'; `boulder plot JOB -o FILE` writes an SVG
that parses as XML with one loss point per step report.

Usage: watch_pty_test.py BIN_DIR REPO_DIR
"""
import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import tempfile
import termios
import time
import unittest
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(__file__))
from e2e_test import SMALL  # noqa: E402
from harness import Cluster, wait_until  # noqa: E402

BIN = REPO = None
STEPS = 40
COLUMNS, ROWS = 100, 30
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class PtyProc:
    """A CLI command whose stdin, stdout and stderr are a pseudo-terminal of COLUMNS x ROWS."""

    def __init__(self, argv):
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        self.p = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                                  start_new_session=True)
        os.close(slave)
        self.data = b""

    def read_until(self, done, timeout):
        """Reads output until done(text) or the end of the output; returns whether done."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done(self.text()):
                return True
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if not ready:
                continue
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every holder of the terminal's other end closed it
                chunk = b""
            if not chunk:
                return done(self.text())
            self.data += chunk
        return done(self.text())

    def text(self):
        return self.data.decode("utf-8", errors="replace")

    def write(self, data):
        os.write(self.master, data)

    def close(self):
        if self.p.poll() is None:
            os.killpg(self.p.pid, 9)
            self.p.wait(5)
        os.close(self.master)


class WatchInAPty(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = Cluster(BIN, workers=1)
        spec = os.path.join(REPO, "examples", "minigpt-cpu.yaml")
        r = cls.c.cli("submit", spec, *SMALL, "--set", f"training.steps={STEPS}",
                      "--set", "training.warmup_steps=5", "--set", "training.schedule=cosine",
                      "-q")
        cls.job_id = r.stdout.strip()

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def test_1_watch_draws_bar_chart_and_step_times(self):
        proc = PtyProc(self.c.cli_argv("watch", self.job_id))
        try:
            ended = proc.read_until(lambda t: f"job {self.job_id} SUCCEEDED" in t, 120)
            out = proc.text()
            self.assertTrue(ended, out[-3000:])
            self.assertEqual(proc.p.wait(30), 0, out[-3000:])
        finally:
            proc.close()
        # The progress bar, complete at the end.
        self.assertIn(f"step {STEPS}/{STEPS} [" + "█" * 10, out)
        # The chart: its axis and braille dots, redrawn in place (cursor up, erase down).
        self.assertIn("┤", out)
        self.assertRegex(out, "[\u2801-\u28ff]")
        self.assertRegex(out, r"\x1b\[\d+A\x1b\[J")
        self.assertRegex(out, r"rank 0: \d+(\.\d+)? (ms|s)")
        # Every line of the redrawn display fits the 100 columns: a wrapped one would throw the
        # cursor movement off.
        display = re.compile(r"^(step \d+/\d+ |rank \d+: |\s*\S* [┤│])")
        lines = [l for l in re.split(r"[\r\n]+", ANSI.sub("", out)) if display.match(l)]
        self.assertGreater(len(lines), 10)
        for line in lines:
            self.assertLess(len(line), COLUMNS, line)

    def test_2_plot_writes_one_point_per_step_report(self):
        self.c.wait_state(self.job_id, ["SUCCEEDED"], 120)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "loss.svg")
            r = self.c.cli("plot", self.job_id, "-o", path)
            self.assertIn(f"({STEPS} step reports", r.stdout)
            root = ET.parse(path).getroot()
        ns = "{http://www.w3.org/2000/svg}"
        self.assertEqual(root.tag, f"{ns}svg")
        loss = [p for p in root.iter(f"{ns}polyline") if p.get("class") == "loss"]
        self.assertEqual(len(loss), 1)
        self.assertEqual(len(loss[0].get("points").split()), STEPS)
        lr = [p for p in root.iter(f"{ns}polyline") if p.get("class") == "lr"]
        self.assertEqual(len(lr), 1)

    def test_3_top_shows_workers_and_jobs_and_quits_on_q(self):
        proc = PtyProc(self.c.cli_argv("top"))
        try:
            shown = proc.read_until(lambda t: "q or Ctrl-C to quit" in t, 30)
            self.assertTrue(shown, proc.text())
            out = proc.text()
            self.assertIn("WORKERS", out)
            self.assertIn("STEP-TIME", out)
            self.assertRegex(out, rf"\n{self.job_id}\s+minigpt-cpu\s+SUCCEEDED\s+{STEPS}/{STEPS}")
            proc.write(b"q")
            wait_until(lambda: proc.p.poll() is not None, 10, "boulder top to quit on q")
            proc.read_until(lambda t: False, 2)
            self.assertEqual(proc.p.returncode, 0, proc.text()[-2000:])
            # The alternate screen is left and the cursor shown again.
            self.assertTrue(proc.text().endswith("\x1b[?25h\x1b[?1049l"), repr(proc.text()[-80:]))
        finally:
            proc.close()


if __name__ == "__main__":
    BIN, REPO = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
