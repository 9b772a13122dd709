// Tests of the deploy checks themselves: each check passes on the real manifests and
// Dockerfiles and fails, with the specific message, on a copy broken in one place. The
// binaries are stand-ins printing CLI11 help with the flags of the binaries' contract
// (issue 2 and 8), so these tests run before and without a build.
// Run: node --test checks_test.mjs
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { checkAgreement, checkImageDefaults, checkReadmeCommands } from "./agreement.mjs";
import { helpReader, parseHelp } from "./cli_help.mjs";
import { loadDockerfiles } from "./check_manifests.mjs";
import { cmakeDefaultSubdirs, lintDockerfile } from "./dockerfile_rules.mjs";
import { parseDockerfile } from "./dockerfile.mjs";
import { checkPolicy } from "./policy.mjs";
import { REPO_ROOT, renderOverlay } from "./render.mjs";
import { validateObject } from "./schema.mjs";

const CONTRACT_HELP = {
  "boulder-coordinator": `Boulder coordinator
Usage: boulder-coordinator [OPTIONS]

Options:
  -h,--help                   Print this help message and exit
  --listen TEXT REQUIRED      gRPC address, HOST:PORT
  --db TEXT REQUIRED          SQLite database file
  --metrics-listen TEXT       Prometheus /metrics address, HOST:PORT
  --health-listen TEXT        Plaintext gRPC health-only address, HOST:PORT
  --tls-cert TEXT             PEM certificate chain
  --tls-key TEXT              PEM private key
  --tls-client-ca TEXT        PEM CA bundle for client certificates
  --auth-file TEXT            Users and worker join tokens
  --insecure                  Plaintext gRPC
  --heartbeat-timeout-ms UINT [15000]
                              A worker silent this long is lost
  --heartbeat-interval-ms UINT [3000]
`,
  "boulder-worker": `Usage: boulder-worker [OPTIONS]

Options:
  -h,--help                   Print this help message and exit
  --coordinator TEXT REQUIRED Coordinator address, HOST:PORT
  --backend TEXT:{auto,cpu,cuda} [auto]
  --metrics-listen TEXT       Prometheus /metrics address, HOST:PORT
  --trainer TEXT              boulder-trainer to spawn (default: beside this binary)
  --work-dir TEXT [/tmp/boulder-worker]
  --checkpoint-root TEXT      Directory for the jobs' checkpoints
  --id TEXT
  --threads UINT [0]
  --tls-ca TEXT               PEM CA bundle
  --join-token-file TEXT      File holding the worker join token
  --insecure                  Plaintext gRPC
`,
  "boulder-trainer": `Usage: boulder-trainer [OPTIONS]

Options:
  -h,--help                   Print this help message and exit
  --spec TEXT REQUIRED        Job spec (YAML)
`,
  boulder: {
    "": `Usage: boulder [OPTIONS] SUBCOMMAND

Options:
  -h,--help                   Print this help message and exit
  --coordinator TEXT (Env:BOULDER_COORDINATOR)

Subcommands:
  submit                      Submit a job
  jobs                        List jobs
  workers                     List workers
`,
    submit: `Usage: boulder submit [OPTIONS] FILE

Positionals:
  FILE TEXT REQUIRED          the job spec

Options:
  -h,--help                   Print this help message and exit
  --set PATH=VALUE            override one spec field
  -f,--follow                 then follow the job
`,
    jobs: "Options:\n  -h,--help  Print this help message and exit\n",
    workers: "Options:\n  -h,--help  Print this help message and exit\n",
  },
};

let tmp;
function fakeBinDir(overrides = {}) {
  const dir = mkdtempSync(path.join(tmp, "bin-"));
  for (const [name, help] of Object.entries({ ...CONTRACT_HELP, ...overrides })) {
    // A string is the help of `NAME --help`; an object maps subcommands ("" for none).
    const bySub = typeof help === "string" ? { "": help } : help;
    const cases = Object.entries(bySub).map(([sub, text]) =>
      `  "${sub === "" ? "--help" : sub}") cat <<'HELP'\n${text}HELP\n  ;;`).join("\n");
    const file = path.join(dir, name);
    writeFileSync(file, `#!/bin/sh\ncase "$1" in\n${cases}\n  *) echo "unknown: $*" >&2; exit 109 ;;\nesac\n`);
    chmodSync(file, 0o755);
  }
  return dir;
}

const rendered = {};
let dockerfiles;
before(() => {
  tmp = mkdtempSync(path.join(os.tmpdir(), "boulder-deploy-test-"));
  for (const o of ["dev", "gpu"]) rendered[o] = renderOverlay(o).docs;
  dockerfiles = loadDockerfiles(REPO_ROOT);
});
after(() => rmSync(tmp, { recursive: true, force: true }));

const docsOf = (overlay) => structuredClone(rendered[overlay]);
const find = (docs, kind, name) => docs.find((d) => d.kind === kind && d.metadata.name.startsWith(name));
const container = (docs, kind, name) => find(docs, kind, name).spec.template.spec.containers[0];
const agreement = (docs, binDir = fakeBinDir()) => checkAgreement(docs, { help: helpReader(binDir), dockerfiles });
const includes = (errors, text) =>
  assert.ok(errors.some((e) => e.includes(text)), `no message contains ${JSON.stringify(text)}:\n${errors.join("\n")}`);

describe("parseHelp", () => {
  test("reads names, REQUIRED, defaults and choices of CLI11 option lines", () => {
    const flags = parseHelp(CONTRACT_HELP["boulder-worker"]);
    assert.deepEqual([...flags.keys()].sort(),
      ["backend", "checkpoint-root", "coordinator", "help", "id", "insecure", "join-token-file",
        "metrics-listen", "threads", "tls-ca", "trainer", "work-dir"]);
    assert.equal(flags.get("coordinator").required, true);
    assert.equal(flags.get("threads").required, false);
    assert.deepEqual(flags.get("backend").choices, ["auto", "cpu", "cuda"]);
    assert.equal(flags.get("backend").default, "auto");
    assert.equal(flags.get("work-dir").default, "/tmp/boulder-worker");
  });
  test("reads CLI11 2.3's TYPE=DEFAULT form", () => {
    const flags = parseHelp("Options:\n  --backend TEXT=auto         Compute backend\n  --threads INT=0  Threads\n  --id TEXT  id\n");
    assert.equal(flags.get("backend").default, "auto");
    assert.equal(flags.get("threads").default, "0");
    assert.equal(flags.get("id").default, null);
  });
  test("ignores flags that only descriptions mention", () => {
    const flags = parseHelp("Options:\n  --a TEXT   see also\n                 --not-an-option for details\n");
    assert.deepEqual([...flags.keys()], ["a"]);
  });
});

describe("manifests against the binaries", () => {
  test("both overlays agree with the contract's flags", () => {
    for (const o of ["dev", "gpu"]) assert.deepEqual(agreement(docsOf(o)), [], o);
  });
  test("the images' CMDs agree with the contract's flags", () => {
    const help = helpReader(fakeBinDir());
    for (const [name, { parsed }] of dockerfiles) assert.deepEqual(checkImageDefaults(name, parsed, help), [], name);
  });
  test("a renamed flag fails", () => {
    const renamed = CONTRACT_HELP["boulder-worker"].replace("--metrics-listen", "--metrics-address");
    const errors = agreement(docsOf("gpu"), fakeBinDir({ "boulder-worker": renamed }));
    includes(errors, "StatefulSet/boulder-worker container worker: --metrics-listen is not a flag of boulder-worker");
  });
  test("a missing binary fails", () => {
    const dir = fakeBinDir();
    rmSync(path.join(dir, "boulder-coordinator"));
    includes(agreement(docsOf("dev"), dir), "boulder-coordinator does not exist or is not executable");
  });
  test("a missing REQUIRED flag fails", () => {
    const docs = docsOf("dev");
    const c = container(docs, "Deployment", "boulder-coordinator");
    c.args = c.args.filter((a) => !a.startsWith("--db"));
    includes(agreement(docs), "boulder-coordinator requires --db, which the args lack");
  });
  test("a containerPort that no flag opens fails", () => {
    const docs = docsOf("dev");
    container(docs, "Deployment", "boulder-coordinator").ports[0].containerPort = 7072;
    const errors = agreement(docs);
    includes(errors, "--listen opens port 7070, which is no containerPort");
    includes(errors, "containerPort 7072 (grpc) is opened by no listener flag of boulder-coordinator");
    includes(errors, "containerPort 7072 is not EXPOSEd by coordinator.Dockerfile");
  });
  test("a listener on loopback fails", () => {
    const docs = docsOf("dev");
    const c = container(docs, "StatefulSet", "boulder-worker");
    c.args = c.args.map((a) => a.replace("--metrics-listen=0.0.0.0:", "--metrics-listen=127.0.0.1:"));
    includes(agreement(docs), "--metrics-listen=127.0.0.1:9465 (args) listens on loopback");
  });
  test("a grpc probe on the metrics port fails", () => {
    const docs = docsOf("dev");
    container(docs, "Deployment", "boulder-coordinator").livenessProbe.grpc.port = 9464;
    includes(agreement(docs), "livenessProbe is grpc on port 9464, which --metrics-listen serves");
  });
  test("a coordinator address that leads elsewhere fails", () => {
    const docs = docsOf("gpu");
    find(docs, "ConfigMap", "boulder-config").data.coordinator = "boulder-coordinator:9464";
    includes(agreement(docs), "coordinator address boulder-coordinator:9464 leads to Deployment/boulder-coordinator port 9464, which is not a gRPC listener");
    find(docs, "ConfigMap", "boulder-config").data.coordinator = "coordinator:7070";
    includes(agreement(docs), "coordinator address coordinator:7070: no Service coordinator in namespace boulder");
  });
  test("a value outside the flag's choices fails", () => {
    const docs = docsOf("dev");
    find(docs, "ConfigMap", "boulder-config").data["worker-backend"] = "tpu";
    includes(agreement(docs), "--backend=tpu: boulder-worker accepts auto, cpu, cuda");
  });
  test("an undefined $(VAR) fails", () => {
    const docs = docsOf("dev");
    container(docs, "StatefulSet", "boulder-worker").args.push("--id=$(HOSTNAME)");
    includes(agreement(docs), "$(HOSTNAME) is not defined in the container's env");
  });
  test("a Service or monitor port that leads nowhere fails", () => {
    const docs = docsOf("dev");
    find(docs, "Service", "boulder-coordinator").spec.ports[1].targetPort = "prometheus";
    find(docs, "PodMonitor", "boulder-worker").spec.podMetricsEndpoints[0].port = "http-metrics";
    const errors = agreement(docs);
    includes(errors, "Service/boulder-coordinator port metrics: targetPort prometheus is no listening containerPort");
    includes(errors, "ServiceMonitor/boulder-coordinator: endpoint port metrics of Service/boulder-coordinator leads to no metrics listener");
    includes(errors, "PodMonitor/boulder-worker: port http-metrics is no named containerPort of StatefulSet/boulder-worker");
  });
  test("a NetworkPolicy that shuts a listening port fails", () => {
    const docs = docsOf("dev");
    find(docs, "NetworkPolicy", "boulder-coordinator").spec.ingress[1].ports[0].port = 9090;
    const errors = agreement(docs);
    includes(errors, "NetworkPolicy/boulder-coordinator: ingress port 9090 is no listening port of Deployment/boulder-coordinator");
    includes(errors, "no ingress rule admits Deployment/boulder-coordinator's listening port 9464");
  });
  test("an image that does not match its Dockerfile fails", () => {
    const docs = docsOf("dev");
    const c = container(docs, "StatefulSet", "boulder-worker");
    c.command = ["/usr/bin/boulder-worker"];
    c.image = "boulder-worker:latest";
    const errors = agreement(docs);
    includes(errors, "image boulder-worker:latest is not pinned");
    includes(errors, "command /usr/bin/boulder-worker is not installed by worker.Dockerfile's final stage");
    container(docs, "Deployment", "boulder-coordinator").image = "registry.example.com/boulder-scheduler:1.0";
    includes(agreement(docs), "image registry.example.com/boulder-scheduler:1.0 is built by no deploy/docker/*.Dockerfile");
  });
});

describe("README commands", () => {
  test("deploy/README.md's boulder commands agree with the contract's CLI", () => {
    const readme = readFileSync(path.join(REPO_ROOT, "deploy/README.md"), "utf8");
    assert.deepEqual(checkReadmeCommands("README", readme, helpReader(fakeBinDir())), []);
  });
  test("an unknown subcommand or flag fails", () => {
    const md = "```bash\nboulder submit job.yaml --wait\nboulder --coordinator x:1 status\n```\n";
    assert.deepEqual(checkReadmeCommands("README", md, helpReader(fakeBinDir())), [
      "README: `boulder submit job.yaml --wait`: --wait is not a flag of boulder submit",
      "README: `boulder --coordinator x:1 status`: status is not a subcommand of boulder (submit, jobs, workers)",
    ]);
  });
});

describe("schemas", () => {
  test("every rendered object is valid", () => {
    for (const o of ["dev", "gpu"]) {
      for (const d of rendered[o]) assert.deepEqual(validateObject(d), [], `${o} ${d.kind}/${d.metadata.name}`);
    }
  });
  test("an unknown field fails", () => {
    const d = find(docsOf("dev"), "StatefulSet", "boulder-worker");
    d.spec.template.spec.containers[0].readinesProbe = { grpc: { port: 7070 } };
    assert.deepEqual(validateObject(d), ["/spec/template/spec/containers/0/readinesProbe: unknown field"]);
  });
  test("a wrong type fails", () => {
    const d = find(docsOf("dev"), "Deployment", "boulder-coordinator");
    d.spec.template.spec.containers[0].ports[0].containerPort = "7070";
    assert.deepEqual(validateObject(d), ["/spec/template/spec/containers/0/ports/0/containerPort: must be integer"]);
  });
  test("a monitor with a misspelt field fails", () => {
    const d = find(docsOf("dev"), "ServiceMonitor", "boulder-coordinator");
    d.spec.endpoints[0].intervall = "15s";
    assert.deepEqual(validateObject(d), ["/spec/endpoints/0/intervall: unknown field"]);
  });
  test("an unknown kind fails", () => {
    assert.deepEqual(validateObject({ apiVersion: "apps/v1", kind: "Deploymnet", metadata: { name: "x" } }),
      [": no schema for apiVersion apps/v1 kind Deploymnet"]);
  });
});

describe("policy", () => {
  test("both overlays comply", () => {
    for (const o of ["dev", "gpu"]) assert.deepEqual(checkPolicy(o, docsOf(o)), [], o);
  });
  test("a GPU worker without its GPU, shm or NCCL settings fails", () => {
    const docs = docsOf("gpu");
    const sts = find(docs, "StatefulSet", "boulder-worker");
    const c = sts.spec.template.spec.containers[0];
    delete c.resources.limits["nvidia.com/gpu"];
    delete c.resources.requests["nvidia.com/gpu"];
    c.volumeMounts = c.volumeMounts.filter((m) => m.mountPath !== "/dev/shm");
    c.envFrom = [];
    sts.spec.template.spec.tolerations = [];
    const errors = checkPolicy("gpu", docs);
    includes(errors, "limits nvidia.com/gpu is unset, not 1");
    includes(errors, "/dev/shm is not an emptyDir with medium Memory");
    includes(errors, "NCCL_SOCKET_IFNAME is not set");
    includes(errors, "NCCL_NVLS_ENABLE is not 0");
    includes(errors, "no toleration for the nvidia.com/gpu taint");
  });
  test("a GPU or the cuda backend in the dev overlay fails", () => {
    const docs = docsOf("dev");
    container(docs, "StatefulSet", "boulder-worker").resources.limits["nvidia.com/gpu"] = 1;
    find(docs, "ConfigMap", "boulder-config").data["worker-backend"] = "cuda";
    const errors = checkPolicy("dev", docs);
    includes(errors, "StatefulSet/boulder-worker container worker: requests a GPU in the dev overlay");
    includes(errors, "--backend is cuda, not cpu");
  });
  test("a scaled or rolling coordinator fails", () => {
    const docs = docsOf("dev");
    const d = find(docs, "Deployment", "boulder-coordinator");
    d.spec.replicas = 2;
    d.spec.strategy = { type: "RollingUpdate" };
    const errors = checkPolicy("dev", docs);
    includes(errors, "replicas is 2, not 1");
    includes(errors, "strategy is not Recreate");
  });
  test("a coordinator NetworkPolicy open to any pod fails", () => {
    const docs = docsOf("dev");
    find(docs, "NetworkPolicy", "boulder-coordinator").spec.ingress[0].from.push({ namespaceSelector: {} });
    includes(checkPolicy("dev", docs), "the gRPC port admits {\"namespaceSelector\":{}}");
  });
  test("an object outside the namespace fails", () => {
    const docs = docsOf("gpu");
    delete find(docs, "ConfigMap", "boulder-nccl").metadata.namespace;
    includes(checkPolicy("gpu", docs), "is in namespace (none: kubectl's current one), not boulder");
  });
  test("a dashboard that is not JSON fails", () => {
    const docs = docsOf("dev");
    find(docs, "ConfigMap", "boulder-grafana-dashboards").data["boulder-training.json"] = "{panels: []";
    includes(checkPolicy("dev", docs), "boulder-training.json: not JSON");
  });
});

describe("Dockerfile lint", () => {
  const cmakeSubdirs = cmakeDefaultSubdirs(readFileSync(path.join(REPO_ROOT, "CMakeLists.txt"), "utf8"));
  const read = (name) => readFileSync(path.join(REPO_ROOT, "deploy/docker", name), "utf8");
  const lint = (text, subdirs = cmakeSubdirs) => lintDockerfile(text, { cmakeSubdirs: subdirs });
  const line = (text, needle) => text.split("\n").findIndex((l) => l.includes(needle)) + 1;

  test("the Dockerfiles pass", () => {
    for (const f of ["coordinator.Dockerfile", "worker.Dockerfile", "cli.Dockerfile"]) assert.deepEqual(lint(read(f)), [], f);
  });
  test("a root or missing USER fails", () => {
    const text = read("coordinator.Dockerfile");
    assert.deepEqual(lint(text.replace("USER 10001:10001", "USER boulder")),
      [`${line(text, "USER 10001")}: USER boulder is not numeric: Kubernetes' runAsNonRoot cannot verify it`]);
    assert.deepEqual(lint(text.replace("USER 10001:10001", "USER 0")), [`${line(text, "USER 10001")}: USER is root`]);
    includes(lint(text.replace("USER 10001:10001\n", "")), "the final stage has no USER: it would run as root");
  });
  test("an unpinned base fails", () => {
    const text = read("coordinator.Dockerfile").replace("FROM ubuntu:24.04 AS build", "FROM ubuntu AS build");
    includes(lint(text), "base image ubuntu is not pinned to a version tag");
    includes(lint(read("worker.Dockerfile").replace("ARG CUDA_VERSION=12.8.1", "ARG CUDA_VERSION")),
      "base image nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 has an ARG without a default");
  });
  test("build tools or a devel base in the final stage fail", () => {
    const text = read("worker.Dockerfile");
    includes(lint(text.replace("-runtime-ubuntu24.04", "-devel-ubuntu24.04")), "the final stage runs on a devel image");
    const withTools = text.replace("xargs apt-get install -y --no-install-recommends", "xargs apt-get install -y --no-install-recommends cmake libgrpc++-dev");
    includes(lint(withTools), "the final stage installs build tool cmake");
    includes(lint(withTools), "the final stage installs build tool libgrpc++-dev");
  });
  test("a single stage fails", () => {
    const text = read("cli.Dockerfile");
    const single = text.slice(0, text.lastIndexOf("\nFROM ubuntu:24.04\n")) + "\nUSER 10001\nHEALTHCHECK NONE\n";
    includes(lint(single), "not multi-stage");
  });
  test("a missing HEALTHCHECK or one on no exposed port fails", () => {
    const text = read("coordinator.Dockerfile");
    const hc = text.slice(text.indexOf("HEALTHCHECK"), text.indexOf("ENTRYPOINT"));
    includes(lint(text.replace(hc, "")), "the final stage has no HEALTHCHECK");
    includes(lint(text.replace("/dev/tcp/127.0.0.1/7070", "/dev/tcp/127.0.0.1/8080")), "HEALTHCHECK checks none of the EXPOSEd ports (7070, 7071, 9464)");
    includes(lint(read("cli.Dockerfile").replace("HEALTHCHECK NONE\n", "")), "HEALTHCHECK NONE when nothing listens");
  });
  test("EXPOSE that disagrees with the CMD's listeners fails", () => {
    const text = read("coordinator.Dockerfile");
    includes(lint(text.replace("EXPOSE 7070 7071 9464", "EXPOSE 7070 7071 9464 8080")), "EXPOSE 8080: no listener flag in CMD/ENTRYPOINT opens it");
    includes(lint(text.replace("EXPOSE 7070 7071 9464", "EXPOSE 7070 7071")), "port 9464 opened by CMD/ENTRYPOINT is not EXPOSEd");
  });
  test("apt-get without hygiene, shell-form ENTRYPOINT and a pipe without pipefail fail", () => {
    const text = read("coordinator.Dockerfile");
    includes(lint(text.replace("apt-get install -y --no-install-recommends \\\n      build", "apt-get install -y \\\n      build")), "apt-get install without --no-install-recommends");
    includes(lint(text.replace(" \\\n && rm -rf /var/lib/apt/lists/*\nWORKDIR", "\nWORKDIR")), "apt lists not removed in the RUN that updated them");
    includes(lint(text.replace('ENTRYPOINT ["/usr/local/bin/boulder-coordinator"]', "ENTRYPOINT /usr/local/bin/boulder-coordinator")), "ENTRYPOINT in shell form");
    const worker = read("worker.Dockerfile");
    const lastShell = worker.lastIndexOf('SHELL ["/bin/bash", "-o", "pipefail", "-c"]\n');
    includes(lint(worker.slice(0, lastShell) + worker.slice(lastShell).replace('SHELL ["/bin/bash", "-o", "pipefail", "-c"]\n', "")),
      "RUN with a pipe without SHELL");
  });
  test("a build that misses a CMake folder fails", () => {
    const errors = lint(read("worker.Dockerfile"), [...cmakeSubdirs, "worker/extra", "bench"]);
    includes(errors, "differs from CMake's default less tests: common;kernels;worker/comm;worker/engine;worker/agent;server;client;worker/extra;bench");
    const noClient = read("cli.Dockerfile").replace("COPY client client\n", "");
    includes(lint(noClient), "the build stage does not COPY client");
  });
  test("the parser reads continuations, ARGs and the final stage", () => {
    const p = parseDockerfile(read("worker.Dockerfile"));
    assert.deepEqual(p.stages.map((s) => [s.from, s.name]), [
      ["nvidia/cuda:12.8.1-devel-ubuntu24.04", "build"],
      ["nvidia/cuda:12.8.1-runtime-ubuntu24.04", null],
    ]);
    assert.deepEqual(p.stages[1].expose, [9465]);
    assert.deepEqual(p.stages[1].entrypoint.exec, ["/usr/local/bin/boulder-worker"]);
  });
});

describe("runtime-deps.sh", () => {
  const script = path.join(REPO_ROOT, "deploy/docker/runtime-deps.sh");
  const cc = spawnSync("cc", ["--version"]).status === 0;
  test("names the packages that own a binary's libraries", { skip: cc ? false : "no C compiler (cc) on this machine" }, () => {
    const dir = mkdtempSync(path.join(tmp, "rd-"));
    writeFileSync(path.join(dir, "m.c"), "#include <math.h>\n#include <stdlib.h>\nint main(int c, char** v){return (int)cos(atof(v[0]));}\n");
    const b = spawnSync("cc", ["-o", path.join(dir, "m"), path.join(dir, "m.c"), "-lm"], { encoding: "utf8" });
    assert.equal(b.status, 0, b.stderr);
    const r = spawnSync(script, [path.join(dir, "m")], { encoding: "utf8" });
    assert.equal(r.status, 0, r.stderr);
    assert.deepEqual(r.stdout.trim().split("\n"), ["libc6"]);
  });
  test("fails on a library that is not installed", { skip: cc ? false : "no C compiler (cc) on this machine" }, () => {
    const dir = mkdtempSync(path.join(tmp, "rd-"));
    writeFileSync(path.join(dir, "gone.c"), "int gone(void){return 1;}\n");
    writeFileSync(path.join(dir, "u.c"), "int gone(void);\nint main(void){return gone();}\n");
    let b = spawnSync("cc", ["-shared", "-fPIC", "-o", path.join(dir, "libgone.so"), path.join(dir, "gone.c")], { encoding: "utf8" });
    assert.equal(b.status, 0, b.stderr);
    b = spawnSync("cc", ["-o", path.join(dir, "u"), path.join(dir, "u.c"), `-L${dir}`, "-lgone"], { encoding: "utf8" });
    assert.equal(b.status, 0, b.stderr);
    rmSync(path.join(dir, "libgone.so"));
    const r = spawnSync(script, [path.join(dir, "u")], { encoding: "utf8" });
    assert.equal(r.status, 1);
    assert.match(r.stderr, /needs libgone\.so, which is not installed/);
  });
  test("fails on a library that no package owns", { skip: cc ? false : "no C compiler (cc) on this machine" }, () => {
    const dir = mkdtempSync(path.join(tmp, "rd-"));
    writeFileSync(path.join(dir, "own.c"), "int own(void){return 1;}\n");
    writeFileSync(path.join(dir, "v.c"), "int own(void);\nint main(void){return own();}\n");
    let b = spawnSync("cc", ["-shared", "-fPIC", "-o", path.join(dir, "libown.so"), path.join(dir, "own.c")], { encoding: "utf8" });
    assert.equal(b.status, 0, b.stderr);
    b = spawnSync("cc", ["-o", path.join(dir, "v"), path.join(dir, "v.c"), `-L${dir}`, "-lown", `-Wl,-rpath,${dir}`], { encoding: "utf8" });
    assert.equal(b.status, 0, b.stderr);
    const r = spawnSync(script, [path.join(dir, "v")], { encoding: "utf8" });
    assert.equal(r.status, 1);
    assert.equal(r.stderr.trim(), `runtime-deps: ${path.join(dir, "libown.so")} belongs to no package`);
  });
});
