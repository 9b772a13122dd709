// Installs tests/deploy's npm packages with `npm ci` (exact versions from
// package-lock.json) into tests/deploy/node_modules, unless what is there already matches
// the lock. The ctest fixture deploy_node_modules runs it before the other deploy tests.
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const dir = path.dirname(fileURLToPath(import.meta.url));
const lock = JSON.parse(readFileSync(path.join(dir, "package-lock.json"), "utf8"));
const installedFile = path.join(dir, "node_modules/.package-lock.json");

function upToDate() {
  if (!existsSync(installedFile)) return false;
  const installed = JSON.parse(readFileSync(installedFile, "utf8")).packages ?? {};
  return Object.entries(lock.packages ?? {})
    .filter(([key]) => key !== "")
    .every(([key, p]) => installed[key]?.version === p.version);
}

if (upToDate()) {
  console.log("tests/deploy/node_modules matches package-lock.json");
  process.exit(0);
}
const r = spawnSync("npm", ["ci", "--no-audit", "--no-fund"], { cwd: dir, stdio: "inherit" });
if (r.error) {
  console.error(`npm ci: ${r.error.message}`);
  process.exit(1);
}
process.exit(r.status ?? 1);
