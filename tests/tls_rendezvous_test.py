"""Data-parallel jobs on a TLS coordinator: coordinator, two CPU workers and the CLI as separate
processes on 127.0.0.1, certificates made at run time (scripts/gen-certs.sh), bearer tokens.

- Over mutual TLS, with workers started as the README shows them (relative --tls-*, --work-dir
  and --join-token-file paths, the trainers running in their attempt directories), and over
  TLS without client certificates, a 2-worker job rendezvouses through the coordinator and
  SUCCEEDS. Afterwards no join token file is left in the attempt directories and the token is
  in no log.
- A trainer whose rendezvous call carries no join token or a wrong one is refused with
  UNAUTHENTICATED, one with a user token with PERMISSION_DENIED, and one without a client
  certificate on the mutual-TLS coordinator is told why the connection was closed; with all
  its credentials the same call gets past authentication (to "job ... not found").

Usage: tls_rendezvous_test.py BIN_DIR REPO_DIR
"""
import glob
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, wait_until  # noqa: E402

BIN = REPO = None
STEPS = 4
# A model that trains in a second or two per step on one core per worker.
SMALL = ["--set", "model.hidden=32", "--set", "model.heads=2", "--set", "model.layers=2",
         "--set", "model.ffn=64", "--set", "model.context=16", "--set", "training.seq_len=16",
         "--set", "training.batch_size=3", "--set", "generation.tokens=0",
         "--set", "resources.collective_timeout_seconds=20", "--set", "max_restarts=0"]
TRAINER_SPEC = """\
model: {preset: minigpt, hidden: 32, heads: 2, layers: 2, ffn: 64, context: 16}
data: {source: arithmetic}
training: {steps: 2, batch_size: 2, seq_len: 16}
generation: {tokens: 0}
resources: {workers: 2, backend: cpu, collective_timeout_seconds: 5}
"""


def relative(flags, cwd):
    """`flags` with every absolute path made relative to `cwd`."""
    return [os.path.relpath(a, cwd) if os.path.isabs(a) else a for a in flags]


class TwoWorkersOverTls:
    """A cluster with two workers on a TLS coordinator; subclasses choose how."""
    MUTUAL = False
    RELATIVE_PATHS = False

    @classmethod
    def setUpClass(cls):
        cls.c = Cluster(BIN, workers=0, security="tls", repo=REPO, mutual_tls=cls.MUTUAL)
        tmp = cls.c.tmp.name
        absolute = cls.c.security.worker
        if cls.RELATIVE_PATHS:
            cls.c.security.worker = relative(absolute, tmp)
        try:
            for _ in range(2):
                cls.c.start_worker(cwd=tmp if cls.RELATIVE_PATHS else None)
        finally:
            cls.c.security.worker = absolute

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def test_1_two_worker_job_succeeds(self):
        spec = os.path.join(REPO, "examples", "minigpt-cpu.yaml")
        job_id = self.c.cli("submit", "-q", spec, *SMALL, "--set", "resources.workers=2",
                            "--set", f"training.steps={STEPS}", user="alice").stdout.strip()
        job = wait_until(lambda: (lambda j: j if j.get("state") in
                                  ("SUCCEEDED", "FAILED", "CANCELLED") else None)(
            self.c.cli_json_user("alice", "get", job_id)), 180, f"job {job_id} to end", 0.5)
        self.assertEqual(job["state"], "SUCCEEDED", job.get("message"))
        self.assertEqual(len(job.get("workers", [])), 2, job)
        report = job.get("latestReport") or job.get("latest_report") or {}
        self.assertEqual(int(report.get("step", 0)), STEPS, job)

        # Both attempt directories are there, without their join token files.
        attempts = glob.glob(os.path.join(self.c.tmp.name, "worker-*", f"job-{job_id}",
                                          "attempt-1"))
        self.assertEqual(len(attempts), 2, attempts)
        for d in attempts:
            self.assertTrue(os.path.exists(os.path.join(d, "spec.json")), d)
            self.assertFalse(os.path.exists(os.path.join(d, "join.token")), d)
        # The join token is in no log: the job's, the workers' or the coordinator's.
        token = self.c.security.tokens["worker"]
        logs = self.c.cli("logs", job_id, user="alice").stdout
        for text in [logs] + [p.output() for p in self.c.procs]:
            self.assertNotIn(token, text)

    def trainer(self, *flags, join_token=None):
        """boulder-trainer as rank 1 of a 2-rank job 999 against the coordinator, with `flags`
        and the join token from a file holding `join_token` (none when None), without
        BOULDER_JOIN_TOKEN in its environment. Returns its last stderr line."""
        tmp = self.c.tmp.name
        spec = os.path.join(tmp, "trainer-spec.yaml")
        with open(spec, "w") as f:
            f.write(TRAINER_SPEC)
        argv = [os.path.join(BIN, "boulder-trainer"), "--spec", spec, "--job-id", "999",
                "--attempt", "1", "--rank", "1", "--world-size", "2", "--threads", "1",
                "--coordinator", self.c.address, "--quiet"] + list(flags)
        if join_token is not None:
            path = os.path.join(tmp, "trainer-join.token")
            with open(path, "w") as f:
                f.write(join_token + "\n")
            argv += ["--join-token-file", path]
        env = {k: v for k, v in os.environ.items() if k != "BOULDER_JOIN_TOKEN"}
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL, env=env)
        self.assertNotEqual(r.returncode, 0, r.stderr)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        return lines[-1] if lines else ""

    def credentials(self):
        """The TLS flags a worker of this cluster passes its trainers."""
        flags = list(self.c.security.worker)
        i = flags.index("--join-token-file")
        del flags[i:i + 2]
        return flags

    def test_2_trainer_without_a_valid_join_token_is_refused(self):
        tls = self.credentials()
        line = self.trainer(*tls)
        self.assertIn("rendezvous set 'arrive/1'", line)
        self.assertIn("UNAUTHENTICATED: no credentials", line)
        line = self.trainer(*tls, join_token="wrong-join-token-0123456789")
        self.assertIn("UNAUTHENTICATED: invalid token", line)
        line = self.trainer(*tls, join_token=self.c.security.tokens["alice"])
        self.assertIn("PERMISSION_DENIED: user alice: worker requests need a worker join token",
                      line)
        # The same call with the join token gets past authentication.
        line = self.trainer(*tls, join_token=self.c.security.tokens["worker"])
        self.assertIn("job 999 not found", line)
        self.assertNotIn(self.c.security.tokens["worker"], line)


class MutualTlsRelativePaths(TwoWorkersOverTls, unittest.TestCase):
    MUTUAL = True
    RELATIVE_PATHS = True

    def test_3_trainer_without_a_client_certificate_is_told_why(self):
        # gRPC only says "Socket closed": the TLS 1.3 client finished its handshake before the
        # coordinator refused the missing certificate.
        line = self.trainer("--tls-ca", self.c.security.files["ca.pem"],
                            join_token=self.c.security.tokens["worker"])
        self.assertIn("Socket closed", line)
        self.assertIn("the coordinator closed the connection after the TLS handshake", line)
        self.assertIn("pass --tls-cert and --tls-key signed by that CA", line)


class TlsWithoutClientCertificates(TwoWorkersOverTls, unittest.TestCase):
    MUTUAL = False
    RELATIVE_PATHS = False


if __name__ == "__main__":
    BIN, REPO = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    unittest.main(argv=sys.argv[:1], verbosity=2)
