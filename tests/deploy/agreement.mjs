// Checks that rendered manifests agree with the binaries and the images they run, so that a
// renamed flag or a moved port breaks this test instead of the cluster:
//
//  - every container runs a Boulder image built by deploy/docker/<name>.Dockerfile
//    (image boulder-<name>), pinned to a tag, whose final stage installs the container's
//    command, EXPOSEs exactly its containerPorts and runs as the pod's runAsUser;
//  - every flag in its args (after $(VAR) expansion) is one the binary's --help lists,
//    with a listed choice where --help gives choices, and every REQUIRED flag is there;
//  - the ports its listener flags open (--listen, --*-listen; the --help default when the
//    flag is absent) are exactly its containerPorts, on an address other pods can reach;
//  - probes hit those ports: grpc probes the gRPC server (--listen), httpGet the HTTP one;
//  - Services, ServiceMonitors, PodMonitors and NetworkPolicies select pods and name ports
//    that exist and serve what they expect;
//  - --coordinator and BOULDER_COORDINATOR name a Service port that leads to a
//    coordinator's gRPC listener.
import path from "node:path";
import { hostPort, isListenerFlag, isLoopback, listenerProtocol, parseFlags } from "./args.mjs";
import { finalStage, installedPaths } from "./dockerfile.mjs";
import { containerEnv, expand, probes, resolvePort, runAsUser, selectedWorkloads, selects, workloads } from "./podspec.mjs";
import { ref } from "./render.mjs";

const SYMBOLIC = /^<[^>]*>$/;

// "boulder-worker:0.1.0" -> {repo: "boulder-worker", tag: "0.1.0"}; registry paths drop.
export function parseImage(image) {
  const at = image.indexOf("@");
  const name = at >= 0 ? image.slice(0, at) : image;
  const slash = name.lastIndexOf("/");
  const colon = name.lastIndexOf(":");
  const repoPath = colon > slash ? name.slice(0, colon) : name;
  return {
    repo: repoPath.split("/").pop(),
    tag: colon > slash ? name.slice(colon + 1) : null,
    digest: at >= 0,
  };
}

// The Dockerfile name for an image repository: boulder-coordinator -> coordinator.
export function dockerfileFor(repo) {
  return repo.startsWith("boulder-") ? `${repo.slice("boulder-".length)}.Dockerfile` : null;
}

// Analyses one container: its binary, expanded flags and listeners. Problems go to `errors`.
function analyzeContainer(ctx, w, container, errors) {
  const where = `${ref(w.doc)} container ${container.name}`;
  const err = (msg) => errors.push(`${where}: ${msg}`);
  const podSpec = w.template.spec ?? {};
  const namespace = w.doc.metadata?.namespace;
  const info = { where, container, podSpec, binary: null, flags: [], listeners: new Map(), ports: new Map() };

  for (const p of container.ports ?? []) info.ports.set(p.containerPort, p.name ?? null);

  const envErrors = [];
  const env = containerEnv(ctx.docs, container, namespace, envErrors);
  envErrors.forEach(err);
  info.env = env;

  const image = parseImage(container.image ?? "");
  const dockerfileName = dockerfileFor(image.repo);
  const dockerfile = dockerfileName ? ctx.dockerfiles.get(dockerfileName) : undefined;
  if (!image.digest && (image.tag === null || image.tag === "latest")) {
    err(`image ${container.image} is not pinned to a version tag`);
  }
  if (!dockerfile) {
    err(`image ${container.image} is built by no deploy/docker/*.Dockerfile (images are boulder-<name>, from <name>.Dockerfile)`);
  }
  const stage = dockerfile ? finalStage(dockerfile.parsed) : null;

  const command = container.command ?? stage?.entrypoint?.exec ?? null;
  if (!command || command.length === 0) {
    err("no command, and its image has no ENTRYPOINT");
    return info;
  }
  info.binary = path.basename(command[0]);
  if (stage) {
    const installed = new Set(installedPaths(stage));
    if (!installed.has(command[0])) {
      err(`command ${command[0]} is not installed by ${dockerfileName}'s final stage (it installs ${[...installed].join(", ")})`);
    }
    const exposed = new Set(stage.expose);
    for (const p of info.ports.keys()) {
      if (!exposed.has(p)) err(`containerPort ${p} is not EXPOSEd by ${dockerfileName}`);
    }
    for (const p of exposed) {
      if (!info.ports.has(p)) err(`${dockerfileName} EXPOSEs ${p}, which is no containerPort`);
    }
    const uid = stage.user ? Number(stage.user.value.split(":")[0]) : null;
    const runAs = runAsUser(podSpec, container);
    if (runAs !== null && uid !== null && runAs !== uid) {
      err(`runAsUser ${runAs} differs from ${dockerfileName}'s USER ${uid}, which owns the image's files`);
    }
  }

  let help;
  try {
    help = ctx.help(info.binary);
  } catch (e) {
    err(e.message);
    return info;
  }
  const rawArgs = [...command.slice(1), ...(container.args ?? [])];
  const expanded = rawArgs.map((a) => {
    const { value, undefinedVars } = expand(a, env);
    for (const v of undefinedVars) err(`${a}: $(${v}) is not defined in the container's env`);
    return value;
  });
  const { flags, positionals } = parseFlags(expanded);
  for (const p of positionals) err(`unexpected positional argument ${JSON.stringify(p)}`);
  info.flags = flags;
  const given = new Set(flags.map((f) => f.name));
  for (const f of flags) {
    const spec = help.flags.get(f.name);
    if (!spec) {
      err(`--${f.name} is not a flag of ${info.binary} (its --help lists ${[...help.flags.keys()].map((n) => `--${n}`).join(" ")})`);
      continue;
    }
    if (spec.choices && f.value !== null && !SYMBOLIC.test(f.value) && !spec.choices.includes(f.value)) {
      err(`--${f.name}=${f.value}: ${info.binary} accepts ${spec.choices.join(", ")}`);
    }
  }
  for (const [name, spec] of help.flags) {
    if (spec.required && !given.has(name)) err(`${info.binary} requires --${name}, which the args lack`);
  }

  // Listeners: explicit flags, else the binary's defaults.
  const listenerFlags = new Map();
  for (const [name, spec] of help.flags) {
    if (isListenerFlag(name) && spec.default) listenerFlags.set(name, { value: spec.default, source: "default" });
  }
  for (const f of flags) {
    if (isListenerFlag(f.name)) listenerFlags.set(f.name, { value: f.value, source: "args" });
  }
  for (const [name, { value, source }] of listenerFlags) {
    const hp = hostPort(value);
    if (hp === null) {
      err(`--${name}=${value} (${source}) is not HOST:PORT`);
      continue;
    }
    if (isLoopback(hp.host)) {
      err(`--${name}=${value} (${source}) listens on loopback: Services, probes and Prometheus cannot reach it`);
    }
    info.listeners.set(hp.port, { flag: name, protocol: listenerProtocol(name) });
  }
  for (const [port, l] of info.listeners) {
    if (!info.ports.has(port)) err(`--${l.flag} opens port ${port}, which is no containerPort`);
  }
  for (const [port, name] of info.ports) {
    if (!info.listeners.has(port)) err(`containerPort ${port}${name ? ` (${name})` : ""} is opened by no listener flag of ${info.binary}`);
  }

  for (const { kind, probe } of probes(container)) {
    const handler = probe.grpc ? "grpc" : probe.httpGet ? "httpGet" : probe.tcpSocket ? "tcpSocket" : null;
    if (handler === null) continue;
    const portSpec = probe[handler].port;
    const port = resolvePort(podSpec, portSpec);
    const l = port === null ? undefined : info.listeners.get(port);
    if (port === null) {
      err(`${kind}Probe port ${portSpec} is no containerPort`);
    } else if (!l) {
      err(`${kind}Probe port ${port} is opened by no listener flag`);
    } else if (handler === "grpc" && l.protocol !== "grpc") {
      err(`${kind}Probe is grpc on port ${port}, which --${l.flag} serves (not the gRPC server)`);
    } else if (handler === "httpGet" && l.protocol !== "http") {
      err(`${kind}Probe is httpGet on port ${port}, which --${l.flag} serves (not HTTP)`);
    }
  }

  if (info.binary === "boulder-worker" && stage && !given.has("trainer")) {
    const trainer = path.posix.join(path.posix.dirname(command[0]), "boulder-trainer");
    if (!installedPaths(stage).includes(trainer)) {
      err(`boulder-worker spawns ${trainer} (its own directory), which ${dockerfileName} does not install`);
    }
  }
  return info;
}

// The listener that a Service port leads to, in each workload the Service selects.
function serviceTargets(ctx, svc, svcPort) {
  const targets = [];
  for (const w of selectedWorkloads(ctx.docs, svc.spec?.selector, svc.metadata?.namespace)) {
    const port = resolvePort(w.template.spec ?? {}, svcPort.targetPort ?? svcPort.port);
    const infos = ctx.infos.filter((i) => i.workload.doc === w.doc);
    const l = infos.map((i) => i.listeners.get(port)).find(Boolean);
    targets.push({ workload: w, port, listener: l ?? null });
  }
  return targets;
}

function checkCoordinatorAddress(ctx, where, namespace, value, errors) {
  if (SYMBOLIC.test(value)) return;
  const hp = hostPort(value);
  if (hp === null) {
    errors.push(`${where}: coordinator address ${value} is not HOST:PORT`);
    return;
  }
  const [svcName, svcNamespace = namespace, ...rest] = hp.host.split(".");
  const suffixOk = rest.length === 0 || rest.join(".") === "svc" || rest.join(".") === "svc.cluster.local";
  const svc = ctx.docs.find((d) => d.kind === "Service" && d.metadata?.name === svcName && d.metadata?.namespace === svcNamespace);
  if (!suffixOk || !svc) {
    errors.push(`${where}: coordinator address ${value}: no Service ${svcName} in namespace ${svcNamespace}`);
    return;
  }
  const svcPort = (svc.spec?.ports ?? []).find((p) => p.port === hp.port);
  if (!svcPort) {
    errors.push(`${where}: coordinator address ${value}: Service ${svcName} has no port ${hp.port}`);
    return;
  }
  const targets = serviceTargets(ctx, svc, svcPort);
  if (targets.length === 0) errors.push(`${where}: coordinator address ${value}: Service ${svcName} selects no pods`);
  for (const t of targets) {
    if (!t.listener || t.listener.protocol !== "grpc") {
      errors.push(`${where}: coordinator address ${value} leads to ${ref(t.workload.doc)} port ${t.port}, which is not a gRPC listener (--listen)`);
    }
  }
}

// Runs every check on one rendered overlay. `help(binary)` returns the binary's parsed
// --help; `dockerfiles` maps "<name>.Dockerfile" to {parsed}. Returns a list of messages.
export function checkAgreement(docs, { help, dockerfiles }) {
  const errors = [];
  const ctx = { docs, help, dockerfiles, infos: [] };
  for (const w of workloads(docs)) {
    for (const c of [...(w.template.spec?.initContainers ?? []), ...(w.template.spec?.containers ?? [])]) {
      const info = analyzeContainer(ctx, w, c, errors);
      info.workload = w;
      ctx.infos.push(info);
    }
  }

  for (const info of ctx.infos) {
    const namespace = info.workload.doc.metadata?.namespace;
    for (const f of info.flags) {
      if (f.name === "coordinator" && f.value !== null) checkCoordinatorAddress(ctx, info.where, namespace, f.value, errors);
    }
    if (info.env?.has("BOULDER_COORDINATOR")) {
      checkCoordinatorAddress(ctx, `${info.where} env BOULDER_COORDINATOR`, namespace, info.env.get("BOULDER_COORDINATOR"), errors);
    }
  }

  for (const svc of docs.filter((d) => d.kind === "Service")) {
    if (!svc.spec?.selector) continue;
    const targets = (svc.spec.ports ?? []).map((p) => [p, serviceTargets(ctx, svc, p)]);
    if (selectedWorkloads(docs, svc.spec.selector, svc.metadata?.namespace).length === 0) {
      errors.push(`${ref(svc)}: its selector matches no pods`);
    }
    for (const [p, ts] of targets) {
      for (const t of ts) {
        if (!t.listener) {
          errors.push(`${ref(svc)} port ${p.name ?? p.port}: targetPort ${p.targetPort ?? p.port} is no listening containerPort of ${ref(t.workload.doc)}`);
        }
      }
    }
  }

  for (const sm of docs.filter((d) => d.kind === "ServiceMonitor")) {
    const namespaces = sm.spec?.namespaceSelector?.matchNames ?? [sm.metadata?.namespace];
    const services = docs.filter((d) => d.kind === "Service" && namespaces.includes(d.metadata?.namespace) &&
      selects(sm.spec?.selector, d.metadata?.labels));
    if (services.length === 0) errors.push(`${ref(sm)}: its selector matches no Service`);
    for (const ep of sm.spec?.endpoints ?? []) {
      for (const svc of services) {
        const p = (svc.spec?.ports ?? []).find((sp) => (ep.port !== undefined ? sp.name === ep.port : sp.targetPort === ep.targetPort));
        if (!p) {
          errors.push(`${ref(sm)}: endpoint port ${ep.port ?? ep.targetPort} is no port of ${ref(svc)}`);
          continue;
        }
        for (const t of serviceTargets(ctx, svc, p)) {
          if (!t.listener || t.listener.protocol !== "http") {
            errors.push(`${ref(sm)}: endpoint port ${ep.port ?? ep.targetPort} of ${ref(svc)} leads to no metrics listener in ${ref(t.workload.doc)}`);
          }
        }
      }
    }
  }

  for (const pm of docs.filter((d) => d.kind === "PodMonitor")) {
    const ws = selectedWorkloads(docs, pm.spec?.selector, pm.metadata?.namespace);
    if (ws.length === 0) errors.push(`${ref(pm)}: its selector matches no pods`);
    for (const ep of pm.spec?.podMetricsEndpoints ?? []) {
      for (const w of ws) {
        const port = resolvePort(w.template.spec ?? {}, ep.port ?? ep.targetPort);
        const l = ctx.infos.filter((i) => i.workload.doc === w.doc).map((i) => i.listeners.get(port)).find(Boolean);
        if (port === null || typeof ep.port !== "string") {
          errors.push(`${ref(pm)}: port ${ep.port ?? ep.targetPort} is no named containerPort of ${ref(w.doc)}`);
        } else if (!l || l.protocol !== "http") {
          errors.push(`${ref(pm)}: port ${ep.port} of ${ref(w.doc)} is no metrics listener`);
        }
      }
    }
  }

  for (const np of docs.filter((d) => d.kind === "NetworkPolicy")) {
    const ws = selectedWorkloads(docs, np.spec?.podSelector, np.metadata?.namespace);
    if (ws.length === 0) errors.push(`${ref(np)}: its podSelector matches no pods`);
    const types = np.spec?.policyTypes ?? ["Ingress"];
    if (!types.includes("Ingress")) continue;
    for (const w of ws) {
      const listening = new Set(ctx.infos.filter((i) => i.workload.doc === w.doc).flatMap((i) => [...i.listeners.keys()]));
      const admitted = new Set();
      let allPorts = false;
      for (const rule of np.spec?.ingress ?? []) {
        if (!rule.ports || rule.ports.length === 0) {
          allPorts = true;
          continue;
        }
        for (const p of rule.ports) {
          const port = resolvePort(w.template.spec ?? {}, p.port);
          if (port === null || !listening.has(port)) {
            errors.push(`${ref(np)}: ingress port ${p.port} is no listening port of ${ref(w.doc)}`);
          } else {
            admitted.add(port);
          }
        }
      }
      for (const port of listening) {
        if (!allPorts && !admitted.has(port)) {
          errors.push(`${ref(np)}: no ingress rule admits ${ref(w.doc)}'s listening port ${port}`);
        }
      }
    }
  }
  return errors;
}

// Checks the images' own defaults: the final stage's ENTRYPOINT binary and the flags of its
// CMD, against the binary's --help. Returns a list of messages.
export function checkImageDefaults(dockerfileName, parsed, help) {
  const errors = [];
  const stage = finalStage(parsed);
  const entry = stage.entrypoint?.exec;
  if (!entry || entry.length === 0) return [`${dockerfileName}: the final stage has no ENTRYPOINT in JSON form`];
  const binary = path.basename(entry[0]);
  let h;
  try {
    h = help(binary);
  } catch (e) {
    return [`${dockerfileName}: ${e.message}`];
  }
  const argv = [...entry.slice(1), ...(stage.cmd?.exec ?? [])];
  if (argv.length === 1 && argv[0] === "--help") return errors;
  const { flags, positionals } = parseFlags(argv);
  for (const p of positionals) errors.push(`${dockerfileName}: CMD has positional argument ${p}`);
  const given = new Set(flags.map((f) => f.name));
  for (const f of flags) {
    if (!h.flags.has(f.name)) errors.push(`${dockerfileName}: CMD passes --${f.name}, which ${binary} does not accept`);
  }
  for (const [name, spec] of h.flags) {
    if (spec.required && !given.has(name)) errors.push(`${dockerfileName}: ${binary} requires --${name}, which CMD lacks`);
  }
  return errors;
}

// Checks the `boulder ...` command lines in a Markdown file's bash blocks against the CLI:
// the subcommand is one `boulder --help` lists and every --flag is one the subcommand's (or
// the CLI's own) --help lists. Returns a list of messages.
export function checkReadmeCommands(fileName, markdown, help) {
  const errors = [];
  let top;
  try {
    top = help("boulder");
  } catch (e) {
    return [`${fileName}: ${e.message}`];
  }
  const blocks = [...markdown.matchAll(/^```(?:bash|sh|shell)\n([\s\S]*?)^```/gm)].map((m) => m[1]);
  for (const block of blocks) {
    for (const line of block.replace(/\\\n/g, " ").split("\n")) {
      const words = line.replace(/#.*$/, "").trim().split(/\s+/).filter(Boolean);
      if (words[0] !== "boulder") continue;
      const shown = `${fileName}: \`${line.trim()}\``;
      let i = 1;
      const flagNames = [];
      while (i < words.length && words[i].startsWith("-")) {
        flagNames.push(words[i]);
        i += words[i].includes("=") || !words[i].startsWith("--") ? 1 : 2;
      }
      const sub = words[i];
      if (sub === undefined || !top.subcommands.includes(sub)) {
        errors.push(`${shown}: ${sub ?? "(none)"} is not a subcommand of boulder (${top.subcommands.join(", ")})`);
        continue;
      }
      let subHelp;
      try {
        subHelp = help("boulder", sub);
      } catch (e) {
        errors.push(`${shown}: ${e.message}`);
        continue;
      }
      flagNames.push(...words.slice(i + 1).filter((w) => w.startsWith("--")));
      for (const w of flagNames) {
        const name = w.replace(/^--/, "").split("=")[0];
        if (w.startsWith("--") && !subHelp.flags.has(name) && !top.flags.has(name)) {
          errors.push(`${shown}: --${name} is not a flag of boulder ${sub}`);
        }
      }
    }
  }
  return errors;
}
