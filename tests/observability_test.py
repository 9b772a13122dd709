"""Observability: what Prometheus stores is what the job reported.

Starts a coordinator and a worker with --metrics-listen 127.0.0.1:0 and the Debian `prometheus`
server on 127.0.0.1 scraping both every second, runs a small job to the end, and checks:
  - the loss series Prometheus stored, paired scrape by scrape with boulder_trainer_step, equals
    step for step the losses the trainer reports for the same spec (a standalone
    boulder-trainer run: training on one CPU thread is deterministic), and its last value is
    the job's latest step report as the coordinator has it; the tokens counter and MFU too;
  - a second, FP8 job (fp8.emulate on the CPU): its per-tensor FP8 gauges and skipped-step
    count, read through Prometheus, equal its last step report as the coordinator has it;
  - the coordinator's gauges and counters, read through Prometheus, count both jobs;
  - `promtool check metrics` passes on both endpoints' output;
  - every metric the PromQL of deploy/grafana/boulder-training.json names is exported.

Usage: observability_test.py BIN_DIR REPO_DIR
"""
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import unittest
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from harness import Cluster, Proc, wait_until  # noqa: E402

BIN = REPO = None

# The seed model shrunk to train in seconds on one core (as in e2e_test.py); enough steps that
# the job runs over several one-second scrapes.
SMALL = ["--set", "model.hidden=64", "--set", "model.heads=4", "--set", "model.layers=2",
         "--set", "model.ffn=256", "--set", "model.context=32", "--set", "training.seq_len=32",
         "--set", "training.batch_size=8", "--set", "training.lr=0.003"]
STEPS = 400
FP8_STEPS = 20
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(address, path):
    with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as r:
        return r.read().decode()


def exported_names(exposition):
    """Metric family names (# TYPE lines) and sample names in a text exposition."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return names


def dashboard_exprs(node):
    """Every PromQL expression in a Grafana dashboard (panels, nested rows, variables)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "query") and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, dict) and isinstance(value.get("query"), str):
                yield value["query"]
            else:
                yield from dashboard_exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from dashboard_exprs(item)


class Observability(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.prometheus = shutil.which("prometheus")
        cls.promtool = shutil.which("promtool")
        if not cls.prometheus or not cls.promtool:
            raise AssertionError("prometheus and promtool must be on PATH (Debian package "
                                 "`prometheus`; scripts/setup.sh installs it)")
        cls.c = Cluster(BIN, workers=0, coordinator_args=["--metrics-listen", "127.0.0.1:0"])
        try:
            cls.coordinator_metrics = cls.c.coordinator.wait_line(
                r"metrics on (127\.0\.0\.1:\d+)", 30).group(1)
            worker = cls.c.start_worker(["--metrics-listen", "127.0.0.1:0"])
            cls.worker_metrics = worker.wait_line(r"metrics on (127\.0\.0\.1:\d+)", 30).group(1)
            cls.start_prometheus()
            cls.run_job()
        except BaseException:
            cls.c.close()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    @classmethod
    def start_prometheus(cls):
        tmp = cls.c.tmp.name
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: boulder-coordinator
    static_configs:
      - targets: ["{cls.coordinator_metrics}"]
  - job_name: boulder-workers
    static_configs:
      - targets: ["{cls.worker_metrics}"]
""")
        cls.prom = f"127.0.0.1:{free_port()}"
        proc = Proc([cls.prometheus, f"--config.file={config}",
                     f"--storage.tsdb.path={os.path.join(tmp, 'tsdb')}",
                     f"--web.listen-address={cls.prom}", "--log.level=warn"])
        cls.c.procs.append(proc)  # stopped by Cluster.close, before the temp dir goes

        def ready():
            try:
                return http_get(cls.prom, "/-/ready") is not None
            except OSError:
                if proc.p.poll() is not None:
                    raise AssertionError("prometheus exited:\n" + proc.output())
                return False

        wait_until(ready, 30, "prometheus to be ready", 0.2)
        wait_until(lambda: sorted(r["metric"]["job"] for r in cls.query("up")["result"]
                                  if r["value"][1] == "1") ==
                   ["boulder-coordinator", "boulder-workers"], 20,
                   "prometheus to scrape the coordinator and the worker", 0.2)

    @classmethod
    def query(cls, promql, at=None):
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"  # evaluate at this instant, not "now"
        url = f"http://{cls.prom}/api/v1/query?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise AssertionError(f"query {promql!r}: {body}")
        return body["data"]

    @classmethod
    def instant(cls, promql):
        """The single value of an instant query, or None when it has no result."""
        result = cls.query(promql)["result"]
        if len(result) > 1:
            raise AssertionError(f"{promql!r}: {len(result)} series, expected one: {result}")
        return float(result[0]["value"][1]) if result else None

    @classmethod
    def run_job(cls):
        spec = os.path.join(REPO, "examples", "minigpt-cpu.yaml")
        overrides = SMALL + ["--set", f"training.steps={STEPS}"]
        cls.job_id = cls.c.cli("submit", spec, *overrides, "-q").stdout.strip()
        cls.c.cli("watch", cls.job_id, timeout=120)
        cls.job = cls.c.job(cls.job_id)
        # The same spec trained standalone, on one thread as the worker's trainer: its reports.
        r = subprocess.run([os.path.join(BIN, "boulder-trainer"), "--spec", spec, *overrides,
                            "--threads", "1", "--report-fd", "1", "--quiet"],
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise AssertionError(f"standalone trainer exited {r.returncode}:\n{r.stderr}")
        cls.reference = {}
        for line in r.stdout.splitlines():
            step = json.loads(line).get("step")
            if step is not None:
                cls.reference[int(step["step"])] = float(step["loss"])
        # An FP8 job, emulated on the CPU, after it.
        fp8 = SMALL + ["--set", f"training.steps={FP8_STEPS}", "--set", "precision=fp8",
                       "--set", "fp8.emulate=true"]
        cls.fp8_job_id = cls.c.cli("submit", spec, *fp8, "-q").stdout.strip()
        cls.c.cli("watch", cls.fp8_job_id, timeout=120)
        cls.fp8_job = cls.c.job(cls.fp8_job_id)

    def series(self, name, at=None):
        """{scrape timestamp: value} of this job's rank-0 `name`, over the 10 minutes up to
        `at` (default: now)."""
        data = self.query(f'{name}{{job_id="{self.job_id}",rank="0"}}[10m]', at)
        self.assertEqual(data["resultType"], "matrix")
        self.assertEqual(len(data["result"]), 1, data)
        return {ts: float(v) for ts, v in data["result"][0]["values"]}

    def test_1_loss_series_matches_the_step_reports(self):
        self.assertEqual(self.job["state"], "SUCCEEDED", self.job.get("message"))
        self.assertEqual(sorted(self.reference), list(range(1, STEPS + 1)))
        final = self.job["latest_report"]
        self.assertEqual(int(final["step"]), STEPS)
        self.assertAlmostEqual(final["loss"], self.reference[STEPS], delta=1e-9,
                               msg="the standalone trainer does not reproduce the job's loss")
        # The gauges keep the last report after the trainer exits: wait for a scrape of it.
        wait_until(lambda: self.instant(f'boulder_trainer_step{{job_id="{self.job_id}"}}') ==
                   STEPS, 15, "a scrape of the last step")
        # Both range queries end at the same instant: a scrape landing between them must not
        # give one series a sample the other lacks.
        at = time.time()
        losses = self.series("boulder_trainer_loss", at)
        steps = self.series("boulder_trainer_step", at)
        # One scrape stamps all its samples alike, and the agent renders one report at a time.
        self.assertEqual(sorted(losses), sorted(steps))
        pairs = sorted((int(steps[ts]), losses[ts]) for ts in losses)
        seen = sorted({s for s, _ in pairs})
        self.assertGreaterEqual(len(seen), 2, f"only steps {seen} were scraped during the run")
        for step, loss in pairs:
            self.assertIn(step, self.reference)
            self.assertAlmostEqual(loss, self.reference[step], delta=1e-9, msg=f"step {step}")
        # The exposition prints 16 significant digits: equal up to the last one.
        self.assertEqual(pairs[-1][0], STEPS)
        self.assertTrue(math.isclose(pairs[-1][1], final["loss"], rel_tol=1e-12), pairs[-1])

        tokens = self.instant(f'boulder_trainer_tokens_total{{job_id="{self.job_id}"}}')
        self.assertEqual(tokens, float(final["tokens_processed"]))
        self.assertEqual(tokens, STEPS * 8 * 32)  # batch_size x seq_len per step
        mfu = self.instant(f'boulder_trainer_mfu_ratio{{job_id="{self.job_id}"}}')
        self.assertIsNotNone(mfu, "no boulder_trainer_mfu_ratio for the job")
        self.assertTrue(0 < mfu < 1, mfu)
        self.assertTrue(math.isclose(
            self.instant(f'boulder_trainer_tokens_per_second{{job_id="{self.job_id}"}}'),
            final["tokens_per_second"], rel_tol=1e-12))

    def test_2_coordinator_counts_the_job(self):
        expected = {
            'boulder_jobs{state="SUCCEEDED"}': 2,
            'boulder_jobs{state="RUNNING"}': 0,
            "boulder_queue_length": 0,
            'boulder_workers{state="WORKER_IDLE"}': 1,
            'boulder_workers{state="WORKER_BUSY"}': 0,
            "boulder_job_submit_to_running_seconds_count": 2,
            'boulder_rpc_requests_total{method="SubmitJob",code="OK"}': 2,
            "boulder_heartbeats_missed_total": 0,
        }
        wait_until(lambda: {q: self.instant(q) for q in expected} == expected, 15,
                   "the coordinator's metrics, scraped, to count the finished job")

    def test_3_promtool_accepts_both_expositions(self):
        # The lint does reject what breaks the conventions (a counter without _total).
        bad = "# HELP boulder_x Requests.\n# TYPE boulder_x counter\nboulder_x 1\n"
        r = subprocess.run([self.promtool, "check", "metrics"], input=bad,
                           capture_output=True, text=True, timeout=30)
        self.assertNotEqual(r.returncode, 0, "promtool check metrics accepted a bad exposition")
        for address in (self.coordinator_metrics, self.worker_metrics):
            text = http_get(address, "/metrics")
            r = subprocess.run([self.promtool, "check", "metrics"], input=text,
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(r.returncode, 0, f"{address}:\n{r.stdout}{r.stderr}")

    def test_5_fp8_gauges_match_the_last_report(self):
        self.assertEqual(self.fp8_job["state"], "SUCCEEDED", self.fp8_job.get("message"))
        final = self.fp8_job["latest_report"]
        self.assertEqual(int(final["step"]), FP8_STEPS)
        stats = final["fp8"]
        self.assertEqual(len(stats), 2 * 4 * 3)  # layers x Linears x (input, weight, grad)
        job = self.fp8_job_id
        wait_until(lambda: self.instant(f'boulder_trainer_step{{job_id="{job}"}}') == FP8_STEPS,
                   15, "a scrape of the FP8 job's last step")
        families = {"scale": "boulder_trainer_fp8_scale", "amax": "boulder_trainer_fp8_amax",
                    "saturated_ratio": "boulder_trainer_fp8_saturated_ratio",
                    "underflow_ratio": "boulder_trainer_fp8_underflow_ratio"}
        for field, family in families.items():
            result = self.query(f'{family}{{job_id="{job}",rank="0"}}')["result"]
            got = {(int(r["metric"]["layer"]), r["metric"]["tensor"], r["metric"]["role"]):
                   float(r["value"][1]) for r in result}
            # proto3 JSON leaves out zeros (layer 0, a ratio of 0).
            want = {(int(t.get("layer", 0)), t["tensor"], t["role"]): float(t.get(field, 0))
                    for t in stats}
            self.assertEqual(sorted(got), sorted(want), family)
            for key, value in want.items():
                self.assertTrue(math.isclose(got[key], value, rel_tol=1e-12, abs_tol=0),
                                f"{family}{key}: {got[key]} != {value}")
        self.assertGreater(min(float(t["scale"]) for t in stats), 0)
        self.assertEqual(self.instant(f'boulder_trainer_skipped_steps{{job_id="{job}"}}'),
                         float(final.get("skipped_steps", 0)))
        # The BF16/FP32 job reports no FP8 series.
        self.assertEqual(
            self.query(f'boulder_trainer_fp8_scale{{job_id="{self.job_id}"}}')["result"], [])

    def test_4_dashboard_uses_only_exported_metrics(self):
        with open(os.path.join(REPO, "deploy", "grafana", "boulder-training.json")) as f:
            dashboard = json.load(f)
        exprs = list(dashboard_exprs(dashboard))
        self.assertGreater(len(exprs), 5)
        used = set()
        for expr in exprs:
            used.update(re.findall(r"\bboulder_[a-zA-Z0-9_:]*", expr))
        exported = (exported_names(http_get(self.coordinator_metrics, "/metrics")) |
                    exported_names(http_get(self.worker_metrics, "/metrics")))
        missing = []
        for name in sorted(used):
            base = next((name[:-len(s)] for s in HISTOGRAM_SUFFIXES if name.endswith(s)), name)
            if name not in exported and base not in exported:
                missing.append(name)
        self.assertEqual(missing, [], "the dashboard names metrics nobody exports")


if __name__ == "__main__":
    BIN, REPO = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
