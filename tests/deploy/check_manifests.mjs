// Checks that the rendered overlays, the images and the README's CLI commands agree with
// the real binaries (see agreement.mjs for the list). Usage: node check_manifests.mjs BIN_DIR [REPO_ROOT]
// BIN_DIR holds boulder-coordinator, boulder-worker, boulder-trainer and boulder (ctest
// passes ${CMAKE_BINARY_DIR}/bin). Exits 1 and lists every disagreement when any is found.
import { spawnSync } from "node:child_process";
import { readFileSync, readdirSync } from "node:fs";
import path from "node:path";
import { checkAgreement, checkImageDefaults, checkReadmeCommands } from "./agreement.mjs";
import { helpReader } from "./cli_help.mjs";
import { finalStage, installedPaths, parseDockerfile } from "./dockerfile.mjs";
import { REPO_ROOT, overlayNames, renderOverlay } from "./render.mjs";

// "<name>.Dockerfile" -> {parsed} for every Dockerfile in deploy/docker.
export function loadDockerfiles(root) {
  const dir = path.join(root, "deploy/docker");
  const out = new Map();
  for (const f of readdirSync(dir).filter((n) => n.endsWith(".Dockerfile"))) {
    out.set(f, { parsed: parseDockerfile(readFileSync(path.join(dir, f), "utf8")) });
  }
  return out;
}

if (process.argv[1] && path.resolve(process.argv[1]) === path.resolve(new URL(import.meta.url).pathname)) {
  if (process.argv.length < 3) {
    console.error("usage: node check_manifests.mjs BIN_DIR [REPO_ROOT]");
    process.exit(2);
  }
  const binDir = path.resolve(process.argv[2]);
  const root = path.resolve(process.argv[3] ?? REPO_ROOT);
  const help = helpReader(binDir);
  const dockerfiles = loadDockerfiles(root);
  let passed = 0;
  let failed = 0;
  const report = (name, errors) => {
    if (errors.length === 0) {
      passed++;
      console.log(`ok   ${name}`);
    } else {
      failed++;
      console.log(`FAIL ${name}`);
      for (const e of errors) console.log(`  ${e}`);
    }
  };
  for (const overlay of overlayNames(root)) {
    let errors;
    try {
      errors = checkAgreement(renderOverlay(overlay, root).docs, { help, dockerfiles });
    } catch (e) {
      errors = [e.message];
    }
    report(`overlay ${overlay} against ${binDir}`, errors);
  }
  for (const [name, { parsed }] of [...dockerfiles].sort()) {
    report(`image defaults of deploy/docker/${name}`, checkImageDefaults(name, parsed, help));
  }
  // The images' build stages run runtime-deps.sh on what they built; run it here on the
  // same binaries (this distro's packages) so that a library it cannot attribute shows now.
  for (const [name, { parsed }] of [...dockerfiles].sort()) {
    const bins = installedPaths(finalStage(parsed)).filter((p) => p.startsWith("/usr/local/bin/"))
      .map((p) => path.join(binDir, path.basename(p)));
    const r = spawnSync(path.join(root, "deploy/docker/runtime-deps.sh"), bins, { encoding: "utf8" });
    report(`runtime-deps.sh on ${name}'s binaries`, r.status === 0 ? [] : [`exit ${r.status}: ${r.stderr.trim()}`]);
  }
  report("boulder commands in deploy/README.md",
    checkReadmeCommands("deploy/README.md", readFileSync(path.join(root, "deploy/README.md"), "utf8"), help));
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed === 0 ? 0 : 1);
}
