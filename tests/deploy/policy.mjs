// What issue 8 asks of the rendered manifests, checked object by object so that an edit
// that drops one of them fails a test: one namespace for everything; a single-replica
// Recreate coordinator on a PersistentVolumeClaim with gRPC readiness and liveness probes;
// workers in a StatefulSet with a headless Service and the pod IP from the downward API;
// requests, limits and a non-root, locked-down securityContext on every container;
// placeholder Secrets marked as such, a TLS one among them; a Grafana dashboard ConfigMap
// with the sidecar label; ServiceMonitor and PodMonitor; a NetworkPolicy admitting only
// workers and labelled clients to the coordinator's gRPC port. Per overlay: `gpu` workers
// get one nvidia.com/gpu, GPU node placement, a memory-backed /dev/shm, NCCL settings and
// the cuda backend; `dev` workers request no GPU and use the cpu backend.
import { parseFlags } from "./args.mjs";
import { containerEnv, expand, workloads } from "./podspec.mjs";
import { ref } from "./render.mjs";

const OVERLAY_EXPECTATIONS = {
  dev: { gpu: false, backend: "cpu" },
  gpu: { gpu: true, backend: "cuda" },
};

const CLIENT_LABEL = "boulder.dev/client";

function component(w, name) {
  return w.template.metadata?.labels?.["app.kubernetes.io/component"] === name;
}

// The value of --FLAG in a container's args after $(VAR) expansion, or undefined.
function flagValue(docs, w, container, flag) {
  const env = containerEnv(docs, container, w.doc.metadata?.namespace, []);
  const args = [...(container.command ?? []).slice(1), ...(container.args ?? [])].map((a) => expand(a, env).value);
  return parseFlags(args).flags.find((f) => f.name === flag)?.value;
}

function checkDashboard(cm, err) {
  for (const [key, text] of Object.entries(cm.data ?? {})) {
    if (!key.endsWith(".json")) continue;
    let dash;
    try {
      dash = JSON.parse(text);
    } catch (e) {
      err(`${ref(cm)} ${key}: not JSON: ${e.message}`);
      continue;
    }
    if (!dash.title || !dash.uid) err(`${ref(cm)} ${key}: a dashboard needs a title and a uid`);
    const panels = (dash.panels ?? []).flatMap((p) => [p, ...(p.panels ?? [])]).filter((p) => p.type !== "row");
    if (panels.length === 0) err(`${ref(cm)} ${key}: no panels`);
    for (const p of panels) {
      if (!(p.targets ?? []).some((t) => typeof t.expr === "string" && t.expr.trim() !== "")) {
        err(`${ref(cm)} ${key}: panel "${p.title}" has no PromQL query`);
      }
    }
  }
}

// Checks one rendered overlay. Returns a list of messages; empty when it complies.
export function checkPolicy(overlay, docs) {
  const errors = [];
  const err = (m) => errors.push(m);

  const seen = new Set();
  for (const d of docs) {
    const key = `${d.kind}/${d.metadata?.namespace ?? ""}/${d.metadata?.name}`;
    if (seen.has(key)) err(`${ref(d)} appears twice`);
    seen.add(key);
  }
  const namespaces = docs.filter((d) => d.kind === "Namespace");
  if (namespaces.length !== 1) {
    err(`expected one Namespace, found ${namespaces.length}`);
  } else {
    const ns = namespaces[0].metadata.name;
    for (const d of docs) {
      if (d.kind !== "Namespace" && d.metadata?.namespace !== ns) {
        err(`${ref(d)} is in namespace ${d.metadata?.namespace ?? "(none: kubectl's current one)"}, not ${ns}`);
      }
    }
  }

  const ws = workloads(docs);
  for (const w of ws) {
    const spec = w.template.spec ?? {};
    for (const c of spec.containers ?? []) {
      const where = `${ref(w.doc)} container ${c.name}`;
      for (const kind of ["requests", "limits"]) {
        for (const r of ["cpu", "memory"]) {
          if (c.resources?.[kind]?.[r] === undefined) err(`${where}: no resources.${kind}.${r}`);
        }
      }
      const sc = c.securityContext ?? {};
      if ((sc.runAsNonRoot ?? spec.securityContext?.runAsNonRoot) !== true) err(`${where}: runAsNonRoot is not true`);
      if (sc.allowPrivilegeEscalation !== false) err(`${where}: allowPrivilegeEscalation is not false`);
      if (sc.readOnlyRootFilesystem !== true) err(`${where}: readOnlyRootFilesystem is not true`);
      if (!(sc.capabilities?.drop ?? []).includes("ALL")) err(`${where}: capabilities do not drop ALL`);
    }
  }

  const coordinators = ws.filter((w) => component(w, "coordinator"));
  if (coordinators.length !== 1) err(`expected one coordinator workload, found ${coordinators.length}`);
  for (const w of coordinators) {
    const d = w.doc;
    if (d.kind !== "Deployment") err(`${ref(d)}: the coordinator is a ${d.kind}, not a Deployment`);
    if (d.spec?.replicas !== 1) err(`${ref(d)}: replicas is ${d.spec?.replicas}, not 1 (SQLite has one writer)`);
    if (d.spec?.strategy?.type !== "Recreate") err(`${ref(d)}: strategy is not Recreate`);
    const spec = w.template.spec ?? {};
    const claims = (spec.volumes ?? []).filter((v) => v.persistentVolumeClaim);
    if (claims.length === 0) err(`${ref(d)}: no PersistentVolumeClaim volume for the database`);
    for (const v of claims) {
      const name = v.persistentVolumeClaim.claimName;
      if (!docs.some((x) => x.kind === "PersistentVolumeClaim" && x.metadata?.name === name)) {
        err(`${ref(d)}: PersistentVolumeClaim ${name} is not in the manifests`);
      }
      if (!(spec.containers ?? []).some((c) => (c.volumeMounts ?? []).some((m) => m.name === v.name))) {
        err(`${ref(d)}: volume ${v.name} is mounted by no container`);
      }
    }
    for (const c of spec.containers ?? []) {
      for (const kind of ["readiness", "liveness"]) {
        if (!c[`${kind}Probe`]?.grpc) err(`${ref(d)} container ${c.name}: no grpc ${kind}Probe`);
      }
    }
  }

  const workers = ws.filter((w) => component(w, "worker"));
  if (workers.length === 0) err("no worker workload");
  for (const w of workers) {
    const d = w.doc;
    if (d.kind !== "StatefulSet") {
      err(`${ref(d)}: workers are a ${d.kind}, not a StatefulSet`);
    } else {
      const svc = docs.find((x) => x.kind === "Service" && x.metadata?.name === d.spec?.serviceName);
      if (!svc) err(`${ref(d)}: serviceName ${d.spec?.serviceName} is no Service in the manifests`);
      else if (svc.spec?.clusterIP !== "None") err(`${ref(svc)}: the workers' Service is not headless`);
    }
    for (const c of w.template.spec?.containers ?? []) {
      const where = `${ref(d)} container ${c.name}`;
      for (const kind of ["readiness", "liveness"]) {
        if (!c[`${kind}Probe`]) err(`${where}: no ${kind}Probe`);
      }
      if (!(c.env ?? []).some((e) => e.valueFrom?.fieldRef?.fieldPath === "status.podIP")) {
        err(`${where}: the pod IP is not passed through the downward API (status.podIP)`);
      }
    }
  }

  const secrets = docs.filter((d) => d.kind === "Secret");
  if (!secrets.some((s) => s.type === "kubernetes.io/tls")) err("no kubernetes.io/tls Secret for the TLS material");
  for (const s of secrets) {
    const values = [...Object.values(s.stringData ?? {}),
      ...Object.values(s.data ?? {}).map((v) => Buffer.from(v, "base64").toString("utf8"))];
    if (values.some((v) => v.includes("REPLACE-ME")) && s.metadata?.annotations?.["boulder.dev/placeholder"] !== "true") {
      err(`${ref(s)} holds placeholders but lacks the annotation boulder.dev/placeholder: "true"`);
    }
  }

  const dashboards = docs.filter((d) => d.kind === "ConfigMap" && d.metadata?.labels?.grafana_dashboard === "1");
  if (dashboards.length === 0) err('no ConfigMap labelled grafana_dashboard: "1"');
  dashboards.forEach((cm) => checkDashboard(cm, err));

  for (const kind of ["ServiceMonitor", "PodMonitor"]) {
    if (!docs.some((d) => d.kind === kind)) err(`no ${kind}`);
  }

  const coordinatorPolicies = docs.filter((d) => d.kind === "NetworkPolicy" &&
    d.spec?.podSelector?.matchLabels?.["app.kubernetes.io/component"] === "coordinator");
  if (coordinatorPolicies.length === 0) err("no NetworkPolicy selects the coordinator");
  const grpcPort = coordinators[0]?.template.spec?.containers?.[0]?.ports?.find((p) => p.name === "grpc")?.containerPort;
  for (const np of coordinatorPolicies) {
    if (!(np.spec?.policyTypes ?? []).includes("Ingress")) err(`${ref(np)}: policyTypes lacks Ingress`);
    for (const rule of np.spec?.ingress ?? []) {
      if (!rule.from || rule.from.length === 0) err(`${ref(np)}: an ingress rule admits every source`);
      if ((rule.from ?? []).some((f) => f.ipBlock)) err(`${ref(np)}: an ingress rule admits an ipBlock`);
      if (!(rule.ports ?? []).some((p) => p.port === grpcPort || p.port === "grpc")) continue;
      for (const f of rule.from ?? []) {
        const labels = f.podSelector?.matchLabels ?? {};
        const isWorkers = labels["app.kubernetes.io/component"] === "worker" && f.namespaceSelector === undefined;
        const isClients = labels[CLIENT_LABEL] === "true";
        if (!isWorkers && !isClients) {
          err(`${ref(np)}: the gRPC port admits ${JSON.stringify(f)}, neither the workers nor pods labelled ${CLIENT_LABEL}: "true"`);
        }
      }
    }
  }

  const expect = OVERLAY_EXPECTATIONS[overlay];
  if (expect) {
    for (const w of ws) {
      for (const c of w.template.spec?.containers ?? []) {
        const gpus = Number(c.resources?.limits?.["nvidia.com/gpu"] ?? 0);
        if (!expect.gpu && gpus > 0) err(`${ref(w.doc)} container ${c.name}: requests a GPU in the ${overlay} overlay`);
      }
    }
    for (const w of workers) {
      const spec = w.template.spec ?? {};
      for (const c of spec.containers ?? []) {
        const where = `${ref(w.doc)} container ${c.name}`;
        const backend = flagValue(docs, w, c, "backend");
        if (backend !== expect.backend) err(`${where}: --backend is ${backend}, not ${expect.backend}`);
        if (!expect.gpu) continue;
        const limit = Number(c.resources?.limits?.["nvidia.com/gpu"] ?? 0);
        const request = c.resources?.requests?.["nvidia.com/gpu"];
        if (limit !== 1) err(`${where}: limits nvidia.com/gpu is ${limit || "unset"}, not 1`);
        if (request !== undefined && Number(request) !== limit) err(`${where}: nvidia.com/gpu request differs from its limit`);
        const shm = (c.volumeMounts ?? []).find((m) => m.mountPath === "/dev/shm");
        const shmVolume = shm && (spec.volumes ?? []).find((v) => v.name === shm.name);
        if (shmVolume?.emptyDir?.medium !== "Memory") err(`${where}: /dev/shm is not an emptyDir with medium Memory`);
        const env = containerEnv(docs, c, w.doc.metadata?.namespace, []);
        if (!env.get("NCCL_SOCKET_IFNAME")) err(`${where}: NCCL_SOCKET_IFNAME is not set`);
        if (env.get("NCCL_NVLS_ENABLE") !== "0") err(`${where}: NCCL_NVLS_ENABLE is not 0`);
      }
      const placed = Object.keys(spec.nodeSelector ?? {}).length > 0 ||
        spec.affinity?.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution;
      if (expect.gpu && !placed) err(`${ref(w.doc)}: no nodeSelector or node affinity for GPU nodes`);
      if (expect.gpu && !(spec.tolerations ?? []).some((t) => t.key === "nvidia.com/gpu")) {
        err(`${ref(w.doc)}: no toleration for the nvidia.com/gpu taint`);
      }
    }
  }
  return errors;
}
