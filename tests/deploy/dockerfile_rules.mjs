// The Dockerfile lint: the subset of hadolint's rules that matter for Boulder's images
// (hadolint itself is packaged by neither Debian nor npm), plus the project's own rules:
//
//   multi-stage   at least two stages; the final stage starts from a clean base image,
//                 not from a build stage and not from a CUDA -devel image
//   pinned bases  every base image has an explicit tag other than "latest" (or a digest)
//   no build tools  the final stage installs no compiler, build system or -dev package
//   non-root      the final stage's last USER is a numeric, non-zero uid (Kubernetes'
//                 runAsNonRoot can only verify a numeric user)
//   HEALTHCHECK   present in the final stage: a CMD that checks one of the EXPOSEd ports,
//                 or NONE, stated, when nothing listens
//   EXPOSE        the final stage's EXPOSEd ports are exactly the ports its CMD/ENTRYPOINT
//                 listener flags (--listen, --*-listen) open
//   exec form     ENTRYPOINT and CMD in JSON form, so signals reach the binary (DL3025)
//   apt hygiene   apt-get install with -y and --no-install-recommends (DL3014, DL3015);
//                 update, install and removal of the lists in one RUN (DL3009); no `apt`
//                 (DL3027), no sudo (DL3004)
//   pipefail      a RUN with a pipe runs under SHELL [..., "-o", "pipefail", ...] (DL4006)
//   COPY not ADD  for local files (DL3020); WORKDIR absolute (DL3000); COPY --from names
//                 an earlier stage (DL3022)
//   build context a stage that configures CMake with -DBOULDER_SUBDIRS lists CMake's
//                 default folders less tests/, and COPYs each of them and CMakeLists.txt
//
// Not enforced: hadolint's DL3008 (pin apt package versions). The versions come from the
// base image's distro release, and a pin breaks the build whenever the archive moves on.
import { finalStage, parseDockerfile } from "./dockerfile.mjs";
import { hostPort, isListenerFlag, parseFlags } from "./args.mjs";

const BUILD_TOOLS = [
  /^build-essential$/, /^cmake$/, /^ninja-build$/, /^make$/, /^gcc(-\d+)?$/, /^g\+\+(-\d+)?$/,
  /^clang(-\d+)?$/, /^pkg-config$/, /^pkgconf$/, /^git$/, /^protobuf-compiler/, /-dev$/,
  /^cuda-nvcc/, /^cuda-toolkit/, /^cuda-libraries-dev/,
];

// The words after "apt-get install", options dropped.
function aptInstallPackages(command) {
  const packages = [];
  for (const m of command.matchAll(/apt-get\s+install\s+([^;&|]*)/g)) {
    for (const w of m[1].split(/\s+/)) {
      if (w && !w.startsWith("-") && !w.startsWith("$")) packages.push(w);
    }
  }
  return packages;
}

function imageTag(ref) {
  if (ref.includes("@sha256:")) return { digest: true };
  const slash = ref.lastIndexOf("/");
  const colon = ref.lastIndexOf(":");
  return colon > slash ? { tag: ref.slice(colon + 1) } : { tag: null };
}

// Returns CMake's default BOULDER_SUBDIRS from the top-level CMakeLists.txt text.
export function cmakeDefaultSubdirs(cmakeText) {
  const m = cmakeText.match(/set\(\s*BOULDER_SUBDIRS\s+"([^"]*)"/);
  if (!m) throw new Error("CMakeLists.txt: no default BOULDER_SUBDIRS found");
  return m[1].split(";").filter(Boolean);
}

// Lints one Dockerfile. `cmakeSubdirs` is CMake's default BOULDER_SUBDIRS. Returns a list
// of messages, each "LINE: problem"; empty when the file passes.
export function lintDockerfile(text, { cmakeSubdirs }) {
  const errors = [];
  const err = (line, msg) => errors.push(`${line}: ${msg}`);
  let parsed;
  try {
    parsed = parseDockerfile(text);
  } catch (e) {
    return [`0: ${e.message}`];
  }
  const { stages } = parsed;
  if (stages.length === 0) return ["0: no FROM"];
  if (stages.length < 2) err(stages[0].line, "not multi-stage: build in one stage, run in another");

  const stageNames = new Set();
  for (const s of stages) {
    if (!stageNames.has(s.from)) {
      if (/\$/.test(s.from)) {
        err(s.line, `base image ${s.rawFrom} has an ARG without a default`);
      } else {
        const t = imageTag(s.from);
        if (!t.digest && (t.tag === null || t.tag === "latest")) {
          err(s.line, `base image ${s.from} is not pinned to a version tag`);
        }
      }
    }
    for (const c of s.copies) {
      if (c.from !== null && !stageNames.has(c.from) && !/^\d+$/.test(c.from)) {
        err(c.line, `COPY --from=${c.from} names no earlier stage`);
      }
    }
    for (const a of s.adds) {
      if (!a.sources.every((src) => /^https?:\/\//.test(src))) {
        err(a.line, "ADD of local files: use COPY");
      }
    }
    for (const w of s.workdirs) {
      if (!w.path.startsWith("/") && !w.path.startsWith("$")) err(w.line, `WORKDIR ${w.path} is relative`);
    }
    const pipefail = (shell) => Array.isArray(shell) && shell.join(" ").includes("pipefail");
    for (const r of s.runs) {
      const cmd = r.command;
      if (/(^|[\s;&|])sudo\s/.test(cmd)) err(r.line, "RUN uses sudo");
      if (/(^|[\s;&|])apt\s+(install|update|upgrade)/.test(cmd)) err(r.line, "RUN uses apt: use apt-get");
      for (const m of cmd.matchAll(/apt-get\s+install([^;&|]*)/g)) {
        if (!/(^|\s)--no-install-recommends(\s|$)/.test(m[1])) err(r.line, "apt-get install without --no-install-recommends");
        if (!/(^|\s)(-y|--yes|--assume-yes|-q+y)(\s|$)/.test(m[1])) err(r.line, "apt-get install without -y");
      }
      if (/apt-get\s+update/.test(cmd)) {
        if (!/apt-get\s+install/.test(cmd)) err(r.line, "apt-get update in a RUN that installs nothing");
        if (!/rm\s+-rf\s+\/var\/lib\/apt\/lists/.test(cmd)) err(r.line, "apt lists not removed in the RUN that updated them");
      }
      if (/[^|]\|[^|]/.test(cmd.replace(/'[^']*'|"[^"]*"/g, "")) && !pipefail(r.shell)) {
        err(r.line, "RUN with a pipe without SHELL [..., \"-o\", \"pipefail\", ...]");
      }
    }
    if (s.name) stageNames.add(s.name);
  }

  const last = finalStage(parsed);
  if (stages.slice(0, -1).some((s) => s.name !== null && s.name === last.from)) {
    err(last.line, `the final stage starts from build stage ${last.from}: start from a runtime base`);
  }
  if (/(^|[-:])devel([-.]|$)/.test(last.from)) {
    err(last.line, `the final stage runs on a devel image (${last.from}): use the runtime image`);
  }
  for (const r of last.runs) {
    for (const p of aptInstallPackages(r.command)) {
      if (BUILD_TOOLS.some((re) => re.test(p))) err(r.line, `the final stage installs build tool ${p}`);
    }
  }
  for (const c of last.copies) {
    if (c.from === null && c.sources.includes(".")) {
      err(c.line, "the final stage copies the whole build context");
    }
  }

  if (last.user === null) {
    err(last.line, "the final stage has no USER: it would run as root");
  } else {
    const m = last.user.value.match(/^(\d+)(?::(\d+))?$/);
    if (!m) err(last.user.line, `USER ${last.user.value} is not numeric: Kubernetes' runAsNonRoot cannot verify it`);
    else if (Number(m[1]) === 0) err(last.user.line, "USER is root");
  }

  for (const [what, ins] of [["ENTRYPOINT", last.entrypoint], ["CMD", last.cmd]]) {
    if (ins !== null && ins.exec === null) err(ins.line, `${what} in shell form: use the JSON form`);
  }
  const listenPorts = new Set();
  const argv = [...(last.entrypoint?.exec?.slice(1) ?? []), ...(last.cmd?.exec ?? [])];
  for (const f of parseFlags(argv).flags) {
    if (!isListenerFlag(f.name)) continue;
    const hp = hostPort(f.value);
    if (hp === null) err(last.cmd?.line ?? last.line, `--${f.name}=${f.value} is not HOST:PORT`);
    else listenPorts.add(hp.port);
  }
  const exposed = new Set();
  for (const p of last.expose) {
    if (typeof p !== "number") err(last.line, `EXPOSE ${p} is not a port number`);
    else exposed.add(p);
  }
  for (const p of exposed) {
    if (!listenPorts.has(p)) err(last.line, `EXPOSE ${p}: no listener flag in CMD/ENTRYPOINT opens it`);
  }
  for (const p of listenPorts) {
    if (!exposed.has(p)) err(last.line, `port ${p} opened by CMD/ENTRYPOINT is not EXPOSEd`);
  }

  const hc = last.healthcheck;
  if (hc === null) {
    err(last.line, "the final stage has no HEALTHCHECK (HEALTHCHECK NONE when nothing listens)");
  } else if (hc.none) {
    if (exposed.size > 0) err(hc.line, "HEALTHCHECK NONE in an image that EXPOSEs ports");
  } else {
    const cmd = hc.exec ? hc.exec.join(" ") : hc.raw;
    const ports = [...cmd.matchAll(/(?:[:/])(\d{2,5})\b/g)].map((m) => Number(m[1]));
    if (!ports.some((p) => exposed.has(p))) {
      err(hc.line, `HEALTHCHECK checks none of the EXPOSEd ports (${[...exposed].join(", ") || "none"})`);
    }
  }

  const expected = cmakeSubdirs.filter((d) => d !== "tests");
  for (const s of stages) {
    for (const r of s.runs) {
      const m = r.command.match(/-DBOULDER_SUBDIRS=([^"\s]+)/);
      if (!/cmake\s+-S/.test(r.command)) continue;
      if (!m) {
        err(r.line, "cmake configures without -DBOULDER_SUBDIRS: the default includes tests/, which the image does not copy");
        continue;
      }
      const listed = m[1].split(";").filter(Boolean);
      if (listed.join(";") !== expected.join(";")) {
        err(r.line, `-DBOULDER_SUBDIRS=${listed.join(";")} differs from CMake's default less tests: ${expected.join(";")}`);
      }
      const copied = new Set(s.copies.filter((c) => c.from === null).flatMap((c) => c.sources));
      for (const top of new Set(["CMakeLists.txt", "proto", ...listed.map((d) => d.split("/")[0])])) {
        if (!copied.has(top)) err(r.line, `the build stage does not COPY ${top}`);
      }
    }
  }
  return errors;
}

