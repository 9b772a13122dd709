// Reading rendered manifests the way the kubelet would: workloads and their pod templates,
// label selectors, named ports, and $(VAR) expansion of container args from the container's
// environment (literal values, ConfigMap keys, downward API).

const WORKLOAD_KINDS = new Set(["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"]);

// Every object that runs pods: {doc, template (the pod template: metadata + spec)}.
export function workloads(docs) {
  const out = [];
  for (const doc of docs) {
    if (WORKLOAD_KINDS.has(doc.kind)) out.push({ doc, template: doc.spec?.template ?? {} });
    else if (doc.kind === "CronJob") out.push({ doc, template: doc.spec?.jobTemplate?.spec?.template ?? {} });
    else if (doc.kind === "Pod") out.push({ doc, template: { metadata: doc.metadata, spec: doc.spec } });
  }
  return out;
}

// Whether `labels` satisfy a selector: a plain map (Service) or a LabelSelector
// ({matchLabels, matchExpressions}). An empty selector matches everything.
export function selects(selector, labels = {}) {
  if (!selector) return false;
  const matchLabels = selector.matchLabels ?? (selector.matchExpressions ? {} : selector);
  for (const [k, v] of Object.entries(matchLabels)) {
    if (labels[k] !== v) return false;
  }
  for (const e of selector.matchExpressions ?? []) {
    const has = Object.hasOwn(labels, e.key);
    const v = labels[e.key];
    if (e.operator === "In" && !(has && e.values.includes(v))) return false;
    if (e.operator === "NotIn" && has && e.values.includes(v)) return false;
    if (e.operator === "Exists" && !has) return false;
    if (e.operator === "DoesNotExist" && has) return false;
  }
  return true;
}

// Workloads whose pods carry the labels `selector` asks for, in the selector's namespace.
export function selectedWorkloads(docs, selector, namespace) {
  return workloads(docs).filter((w) =>
    (w.doc.metadata?.namespace ?? null) === (namespace ?? null) &&
    selects(selector, w.template.metadata?.labels));
}

// The container port a Service targetPort, probe port or monitor port refers to: a number
// is itself, a name is looked up among the pod's containers. Returns the number or null.
export function resolvePort(podSpec, port) {
  if (typeof port === "number") return port;
  if (typeof port === "string" && /^\d+$/.test(port)) return Number(port);
  for (const c of podSpec.containers ?? []) {
    for (const p of c.ports ?? []) {
      if (p.name === port) return p.containerPort;
    }
  }
  return null;
}

function findObject(docs, kind, name, namespace) {
  return docs.find((d) => d.kind === kind && d.metadata?.name === name &&
    (d.metadata?.namespace ?? null) === (namespace ?? null));
}

// The container's environment as Kubernetes builds it for $(VAR) expansion: name -> value.
// Downward-API values are symbolic ("<fieldRef:status.podIP>"); Secret values are
// "<secret:NAME/KEY>". Problems (a ConfigMap or key that does not exist) go to `errors`.
export function containerEnv(docs, container, namespace, errors) {
  const env = new Map();
  for (const from of container.envFrom ?? []) {
    const name = from.configMapRef?.name;
    if (name === undefined) continue;
    const cm = findObject(docs, "ConfigMap", name, namespace);
    if (!cm) {
      if (!from.configMapRef.optional) errors.push(`envFrom: ConfigMap ${name} is not in the manifests`);
      continue;
    }
    for (const [k, v] of Object.entries(cm.data ?? {})) env.set((from.prefix ?? "") + k, v);
  }
  for (const e of container.env ?? []) {
    if (e.value !== undefined) {
      env.set(e.name, expand(e.value, env).value);
    } else if (e.valueFrom?.configMapKeyRef) {
      const { name, key, optional } = e.valueFrom.configMapKeyRef;
      const cm = findObject(docs, "ConfigMap", name, namespace);
      if (!cm || cm.data?.[key] === undefined) {
        if (!optional) errors.push(`env ${e.name}: ConfigMap ${name} has no key ${key}`);
        continue;
      }
      env.set(e.name, cm.data[key]);
    } else if (e.valueFrom?.fieldRef) {
      env.set(e.name, `<fieldRef:${e.valueFrom.fieldRef.fieldPath}>`);
    } else if (e.valueFrom?.resourceFieldRef) {
      env.set(e.name, `<resourceFieldRef:${e.valueFrom.resourceFieldRef.resource}>`);
    } else if (e.valueFrom?.secretKeyRef) {
      const { name, key } = e.valueFrom.secretKeyRef;
      env.set(e.name, `<secret:${name}/${key}>`);
    } else {
      env.set(e.name, "");
    }
  }
  return env;
}

// Expands $(VAR) as the kubelet does ($$ escapes a dollar). Returns {value, undefinedVars}:
// a reference to a variable the container does not define stays literal in Kubernetes,
// which for Boulder's args is always a mistake.
export function expand(text, env) {
  const undefinedVars = [];
  const value = text.replace(/\$\$|\$\((\w+)\)/g, (whole, name) => {
    if (whole === "$$") return "$";
    if (env.has(name)) return env.get(name);
    undefinedVars.push(name);
    return whole;
  });
  return { value, undefinedVars };
}

// The pod's effective runAsUser for a container (the container's setting wins).
export function runAsUser(podSpec, container) {
  return container.securityContext?.runAsUser ?? podSpec.securityContext?.runAsUser ?? null;
}

// Probes of a container, as [{kind: "readiness"|..., probe}].
export function probes(container) {
  const out = [];
  for (const kind of ["startup", "readiness", "liveness"]) {
    const p = container[`${kind}Probe`];
    if (p) out.push({ kind, probe: p });
  }
  return out;
}
