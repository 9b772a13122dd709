"""Security end to end: coordinator, worker and CLI as separate processes on 127.0.0.1 over
mutual TLS with certificates made at run time (scripts/gen-certs.sh) and bearer tokens.

A user's job runs to the end on a worker that joined with the join token; requests without or
with wrong tokens are refused (UNAUTHENTICATED); another user may not read or cancel it
(PERMISSION_DENIED); an admin may; clients without the CA or without a client certificate
cannot connect; a worker with a wrong join token is refused and says why.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Cluster, wait_until  # noqa: E402

BIN = REPO = None
STEPS = 3


def last_line(r):
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    return lines[-1] if lines else ""


class SecurityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.c = Cluster(BIN, workers=1, security="tls", repo=REPO, mutual_tls=True)
        spec = os.path.join(REPO, "examples", "minigpt-cpu.yaml")
        r = cls.c.cli("submit", "-q", spec, "--set", f"training.steps={STEPS}",
                      "--set", "generation.tokens=0", user="alice")
        cls.job_id = r.stdout.strip()

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def test_1_owner_runs_job_to_the_end_over_tls(self):
        job = wait_until(lambda: (lambda j: j if j.get("state") == "SUCCEEDED" else None)(
            self.c.cli_json_user("alice", "get", self.job_id)), 240, "alice's job to succeed", 0.5)
        self.assertEqual(job.get("owner"), "alice")
        report = job.get("latestReport") or job.get("latest_report") or {}
        self.assertEqual(int(report.get("step", 0)), STEPS, job)

    def test_2_no_or_wrong_token_is_unauthenticated(self):
        r = self.c.cli("jobs", check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no credentials", last_line(r))
        bad = os.path.join(self.c.tmp.name, "bad.token")
        with open(bad, "w") as f:
            f.write("not-a-valid-token-at-all\n")
        r = self.c.cli("jobs", flags=self.c.security.cli + ["--token-file", bad], check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("invalid token", last_line(r))
        env = dict(os.environ, BOULDER_TOKEN="also-not-a-valid-token")
        r = self.c.cli("get", self.job_id, check=False, env=env)
        self.assertIn("invalid token", last_line(r))

    def test_3_other_user_is_denied_admin_is_not(self):
        r = self.c.cli("get", self.job_id, user="bob", check=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"user bob may not read job {self.job_id}", last_line(r))
        r = self.c.cli("cancel", self.job_id, user="bob", check=False)
        self.assertIn(f"user bob may not cancel job {self.job_id}", last_line(r))
        r = self.c.cli("logs", self.job_id, user="bob", check=False)
        self.assertNotEqual(r.returncode, 0)
        bob_jobs = self.c.cli_json_user("bob", "jobs").get("jobs", [])
        self.assertNotIn(self.job_id, [j["id"] for j in bob_jobs])
        root_jobs = self.c.cli_json_user("root", "jobs").get("jobs", [])
        self.assertIn(self.job_id, [j["id"] for j in root_jobs])
        self.assertEqual(self.c.cli_json_user("root", "get", self.job_id)["id"], self.job_id)

        # Bob's own job: bob and the admin may cancel it, alice may not.
        spec = os.path.join(REPO, "examples", "minigpt-cpu.yaml")
        bob_job = self.c.cli("submit", "-q", spec, "--set", "training.steps=100000",
                             user="bob").stdout.strip()
        r = self.c.cli("cancel", bob_job, user="alice", check=False)
        self.assertIn(f"user alice may not cancel job {bob_job}", last_line(r))
        self.c.cli("cancel", bob_job, user="root")
        self.assertEqual(self.c.cli_json_user("bob", "get", bob_job)["state"], "CANCELLED")

    def test_4_tls_is_required(self):
        # No CA: the system's roots do not know the test CA.
        r = self.c.cli("jobs", flags=[], user="alice", check=False, timeout=30)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("cannot reach the coordinator", last_line(r))
        # Plaintext against a TLS coordinator.
        r = self.c.cli("jobs", flags=["--insecure"], user="alice", check=False, timeout=30)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("cannot reach the coordinator", last_line(r))
        # The CA but no client certificate: the coordinator requires one.
        r = self.c.cli("jobs", flags=["--tls-ca", self.c.security.files["ca.pem"]],
                       user="alice", check=False, timeout=30)
        self.assertNotEqual(r.returncode, 0)
        # A bad TLS file is named.
        r = self.c.cli("jobs", flags=["--tls-ca", "/nonexistent/ca.pem"], user="alice",
                       check=False)
        self.assertIn("tls_ca: cannot read '/nonexistent/ca.pem'", last_line(r))

    def test_5_worker_with_wrong_join_token_is_refused(self):
        bad = os.path.join(self.c.tmp.name, "bad-join.token")
        with open(bad, "w") as f:
            f.write("wrong-join-token-0123456789\n")
        flags = [a for a in self.c.security.worker]
        flags[flags.index("--join-token-file") + 1] = bad
        saved = self.c.security.worker
        self.c.security.worker = flags
        try:
            w = self.c.start_worker(wait=False)
        finally:
            self.c.security.worker = saved
        w.wait_line(r"invalid token", 30)
        w.stop()
        workers = self.c.cli_json_user("alice", "workers").get("workers", [])
        self.assertEqual(len(workers), 1, workers)

if __name__ == "__main__":
    BIN, REPO = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1], verbosity=2)
