"""Multi-process test harness: starts a coordinator and workers on 127.0.0.1 and runs the CLI.

Every process is started in its own process group and killed on close(); every wait has a
deadline. Used by the end-to-end tests in this folder.
"""
import json
import os
import re
import signal
import sqlite3
import subprocess
import tempfile
import threading
import time


class Proc:
    """A child process whose output lines are collected by a reader thread."""

    def __init__(self, argv, env=None, cwd=None):
        self.argv = argv
        self.lines = []
        self._cv = threading.Condition()
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, text=True, env=env, cwd=cwd,
                                  start_new_session=True)
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self):
        for line in self.p.stdout:
            with self._cv:
                self.lines.append(line.rstrip("\n"))
                self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    def wait_line(self, pattern, timeout):
        """Returns the first match of `pattern` in the output, waiting up to `timeout` s."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for line in self.lines:
                    m = rx.search(line)
                    if m:
                        return m
                left = deadline - time.monotonic()
                if left <= 0 or (self.p.poll() is not None and not self._t.is_alive()):
                    raise AssertionError(
                        f"{os.path.basename(self.argv[0])}: no line matching {pattern!r} "
                        f"within {timeout}s; output:\n" + "\n".join(self.lines[-40:]))
                self._cv.wait(min(left, 0.2))

    def output(self):
        with self._cv:
            return "\n".join(self.lines)

    def kill(self, sig=signal.SIGKILL):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout=10):
        """SIGTERM, then SIGKILL after `timeout` s; returns the exit code."""
        self.kill(signal.SIGTERM)
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            return self.p.wait(5)


def wait_until(fn, timeout, what, interval=0.1):
    """Polls fn() until it returns a truthy value; fails naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class Security:
    """How a Cluster's processes talk: the flags each kind of process gets.

    The default is plaintext without authentication, asked for explicitly with --insecure as
    the binaries require. Security.tls() makes certificates (scripts/gen-certs.sh) and a
    tokens file in `tmp` for TLS (optionally mutual) with bearer tokens.
    """

    def __init__(self):
        self.coordinator = ["--insecure"]
        self.worker = ["--insecure"]
        self.cli = ["--insecure"]
        self.tokens = {}  # user name (or "worker") -> token
        self.files = {}

    @staticmethod
    def tls(repo, tmp, mutual=False, users=(("alice", False), ("bob", False), ("root", True))):
        sec = Security()
        pki = os.path.join(tmp, "pki")
        subprocess.run([os.path.join(repo, "scripts", "gen-certs.sh"), pki], check=True,
                       capture_output=True, timeout=60)
        lines = []
        for name, admin in users:
            token = f"{name}-" + os.urandom(16).hex()
            sec.tokens[name] = token
            lines.append(f"user {name} {token}" + (" admin" if admin else ""))
            path = os.path.join(tmp, f"{name}.token")
            with open(path, "w") as f:
                f.write(token + "\n")
            sec.files[name] = path
        join = "join-" + os.urandom(16).hex()
        sec.tokens["worker"] = join
        lines.append(f"worker {join}")
        sec.files["worker"] = os.path.join(tmp, "join.token")
        with open(sec.files["worker"], "w") as f:
            f.write(join + "\n")
        sec.files["auth"] = os.path.join(tmp, "tokens")
        with open(sec.files["auth"], "w") as f:
            f.write("\n".join(lines) + "\n")
        sec.files.update({k: os.path.join(pki, k) for k in
                          ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")})
        sec.coordinator = ["--tls-cert", sec.files["server.pem"], "--tls-key",
                           sec.files["server.key"], "--auth-file", sec.files["auth"]]
        client_cert = []
        if mutual:
            sec.coordinator += ["--tls-client-ca", sec.files["ca.pem"]]
            client_cert = ["--tls-cert", sec.files["client.pem"], "--tls-key",
                           sec.files["client.key"]]
        sec.worker = ["--tls-ca", sec.files["ca.pem"], "--join-token-file",
                      sec.files["worker"]] + client_cert
        sec.cli = ["--tls-ca", sec.files["ca.pem"]] + client_cert
        return sec


class Cluster:
    """A coordinator (port 0, temp SQLite) and N workers, all on 127.0.0.1."""

    def __init__(self, bin_dir, workers=1, worker_args=(), coordinator_args=(),
                 security=None, repo=None, mutual_tls=False):
        """With repo set and security="tls", makes certificates and tokens (Security.tls)."""
        self.bin = bin_dir
        self.tmp = tempfile.TemporaryDirectory(prefix="boulder-e2e-")
        if security == "tls":
            security = Security.tls(repo, self.tmp.name, mutual=mutual_tls)
        self.security = security or Security()
        self.db = os.path.join(self.tmp.name, "boulder.db")
        self.procs = []
        self.worker_procs = []
        self.coordinator = None
        self.address = None
        self.coordinator_args = list(coordinator_args)
        self.start_coordinator()
        for i in range(workers):
            self.start_worker(list(worker_args))

    def start_coordinator(self, port=0):
        argv = [os.path.join(self.bin, "boulder-coordinator"), "--listen",
                f"127.0.0.1:{port}", "--db", self.db] + self.security.coordinator + \
            self.coordinator_args
        self.coordinator = Proc(argv)
        self.procs.append(self.coordinator)
        m = self.coordinator.wait_line(r"listening on (127\.0\.0\.1:\d+)", 30)
        self.address = m.group(1)
        return self.coordinator

    def start_worker(self, extra=(), wait=True, cwd=None):
        """With `cwd`, the worker runs there and gets its --work-dir relative to it."""
        wd = tempfile.mkdtemp(dir=self.tmp.name, prefix="worker-")
        if cwd is not None:
            wd = os.path.relpath(wd, cwd)
        argv = [os.path.join(self.bin, "boulder-worker"), "--coordinator", self.address,
                "--backend", "cpu", "--work-dir", wd, "--threads", "1"] + \
            self.security.worker + list(extra)
        w = Proc(argv, cwd=cwd)
        self.procs.append(w)
        self.worker_procs.append(w)
        if wait:
            w.wait_line(r"registered", 30)
        return w

    def cli_argv(self, *args, address=None, flags=None, user=None):
        """The CLI's argv: `flags` replace the cluster's security flags; `user` adds that
        user's --token-file."""
        sec = list(self.security.cli if flags is None else flags)
        if user is not None:
            sec += ["--token-file", self.security.files[user]]
        return [os.path.join(self.bin, "boulder"), "--coordinator",
                address or self.address] + sec + list(args)

    def cli(self, *args, timeout=60, check=True, address=None, flags=None, user=None, env=None):
        argv = self.cli_argv(*args, address=address, flags=flags, user=user)
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL, env=env)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
        return r

    def cli_json(self, *args):
        return json.loads(self.cli(*args, "-o", "json").stdout)

    def cli_json_user(self, user, *args):
        """`boulder ARGS -o json` with `user`'s token file, parsed."""
        return json.loads(self.cli(*args, "-o", "json", user=user).stdout)

    def job(self, job_id):
        return self.cli_json("get", str(job_id))

    def wait_state(self, job_id, states, timeout):
        states = set(states)
        return wait_until(lambda: (lambda j: j if j.get("state") in states else None)(
            self.job(job_id)), timeout, f"job {job_id} to reach {sorted(states)}", 0.2)

    def close(self):
        for p in reversed(self.procs):
            p.stop()
        self.tmp.cleanup()


# ---- the coordinator's store, read without a protobuf package ---------------------------

def _varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def decode(buf):
    """Protobuf wire format -> {field number: [values]} (varint ints, fixed64 raw bytes,
    length-delimited bytes)."""
    fields, i = {}, 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = bytes(buf[i:i + 8]), i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = bytes(buf[i:i + n]), i + n
        elif wire == 5:
            value, i = bytes(buf[i:i + 4]), i + 4
        else:
            raise ValueError(f"wire type {wire}")
        fields.setdefault(number, []).append(value)
    return fields


def job_events(db, job_id):
    """The job's stored JobEvent messages, decoded, in order. The coordinator holds its
    database in exclusive locking mode: stop it first."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        rows = con.execute("SELECT event FROM job_events WHERE job_id = ? ORDER BY seq",
                           (job_id,)).fetchall()
    finally:
        con.close()
    return [decode(blob) for (blob,) in rows]


def trainers_of(job_id):
    """[(pid, rank)] of live boulder-trainer processes of `job_id` (by their command line)."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        if argv and argv[0].endswith(b"boulder-trainer") and b"--job-id" in argv:
            if argv[argv.index(b"--job-id") + 1] == str(job_id).encode():
                rank = int(argv[argv.index(b"--rank") + 1]) if b"--rank" in argv else 0
                pids.append((int(pid), rank))
    return pids
