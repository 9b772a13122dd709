// Lints deploy/docker/*.Dockerfile with the rules in dockerfile_rules.mjs (hadolint is
// packaged by neither Debian nor npm). Usage: node dockerfile_lint.mjs [REPO_ROOT]
// Exits 1 and lists every problem as FILE:LINE: message when any file fails.
import { readFileSync, readdirSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { cmakeDefaultSubdirs, lintDockerfile } from "./dockerfile_rules.mjs";

const root = path.resolve(process.argv[2] ?? path.join(path.dirname(fileURLToPath(import.meta.url)), "../.."));
const dockerDir = path.join(root, "deploy/docker");
const cmakeSubdirs = cmakeDefaultSubdirs(readFileSync(path.join(root, "CMakeLists.txt"), "utf8"));
const files = readdirSync(dockerDir).filter((f) => f.endsWith(".Dockerfile")).sort();
if (files.length === 0) {
  console.error(`no *.Dockerfile in ${dockerDir}`);
  process.exit(1);
}
let failed = 0;
for (const f of files) {
  const errors = lintDockerfile(readFileSync(path.join(dockerDir, f), "utf8"), { cmakeSubdirs });
  if (errors.length === 0) {
    console.log(`ok   deploy/docker/${f}`);
  } else {
    failed++;
    console.log(`FAIL deploy/docker/${f}`);
    for (const e of errors) console.log(`  deploy/docker/${f}:${e}`);
  }
}
console.log(`${files.length - failed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
