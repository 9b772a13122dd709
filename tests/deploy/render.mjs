// Renders the kustomize overlays with `kubectl kustomize` and parses the output.
import { spawnSync } from "node:child_process";
import { readdirSync, statSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments } from "yaml";

export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");

// The overlays under deploy/k8s/overlays, sorted.
export function overlayNames(root = REPO_ROOT) {
  const dir = path.join(root, "deploy/k8s/overlays");
  return readdirSync(dir).filter((d) => statSync(path.join(dir, d)).isDirectory()).sort();
}

// Runs `kubectl kustomize` on one overlay. Returns {docs, stderr}; throws with kubectl's
// message when kubectl is missing or the build fails.
export function renderOverlay(overlay, root = REPO_ROOT) {
  const dir = path.join(root, "deploy/k8s/overlays", overlay);
  const r = spawnSync("kubectl", ["kustomize", dir], { encoding: "utf8", timeout: 60_000 });
  if (r.error) {
    throw new Error(r.error.code === "ENOENT"
      ? "kubectl not found: install it (scripts/setup.sh installs Debian's kubernetes-client)"
      : `kubectl kustomize ${dir}: ${r.error.message}`);
  }
  if (r.status !== 0) throw new Error(`kubectl kustomize ${dir} exited ${r.status}:\n${r.stderr}`);
  const docs = [];
  for (const d of parseAllDocuments(r.stdout)) {
    if (d.errors.length > 0) throw new Error(`kubectl kustomize ${dir}: bad YAML: ${d.errors[0].message}`);
    const v = d.toJS();
    if (v !== null) docs.push(v);
  }
  return { docs, stderr: r.stderr };
}

// "Kind/name" for messages.
export function ref(doc) {
  return `${doc.kind}/${doc.metadata?.name}`;
}
