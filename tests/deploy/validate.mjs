// Renders every overlay under deploy/k8s/overlays with `kubectl kustomize` and validates
// each object offline: against the Kubernetes API schemas of kubernetes-models (and the
// Prometheus operator's for the monitors), unknown fields included (schema.mjs), and
// against what issue 8 asks of the deployment (policy.mjs).
// Usage: node validate.mjs [REPO_ROOT]. Exits 1 and lists every problem when any is found.
import path from "node:path";
import { checkPolicy } from "./policy.mjs";
import { REPO_ROOT, overlayNames, ref, renderOverlay } from "./render.mjs";
import { validateObject } from "./schema.mjs";

const root = path.resolve(process.argv[2] ?? REPO_ROOT);
let passed = 0;
let failed = 0;
const overlays = overlayNames(root);
if (overlays.length === 0) {
  console.error("no overlays under deploy/k8s/overlays");
  process.exit(1);
}
for (const overlay of overlays) {
  let docs;
  try {
    ({ docs } = renderOverlay(overlay, root));
  } catch (e) {
    failed++;
    console.log(`FAIL overlay ${overlay}: ${e.message}`);
    continue;
  }
  const errors = [];
  for (const d of docs) {
    for (const e of validateObject(d)) errors.push(`schema: ${ref(d)}${e}`);
  }
  for (const e of checkPolicy(overlay, docs)) errors.push(`policy: ${e}`);
  if (errors.length === 0) {
    passed++;
    console.log(`ok   overlay ${overlay}: ${docs.length} objects (${[...new Set(docs.map((d) => d.kind))].sort().join(", ")})`);
  } else {
    failed++;
    console.log(`FAIL overlay ${overlay}`);
    for (const e of errors) console.log(`  ${e}`);
  }
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
