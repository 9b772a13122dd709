// Command-line conventions shared by the checks: how Boulder's daemons take flags and which
// flags open listeners.

// Parses daemon arguments: "--name=value", "--name value" or a bare "--name". Daemons take
// no positional arguments, so anything else is reported as one.
export function parseFlags(args) {
  const flags = [];
  const positionals = [];
  for (let i = 0; i < args.length; i++) {
    const a = args[i];
    if (!a.startsWith("--")) {
      positionals.push(a);
      continue;
    }
    const eq = a.indexOf("=");
    if (eq >= 0) {
      flags.push({ name: a.slice(2, eq), value: a.slice(eq + 1) });
    } else if (i + 1 < args.length && !args[i + 1].startsWith("-")) {
      flags.push({ name: a.slice(2), value: args[i + 1] });
      i++;
    } else {
      flags.push({ name: a.slice(2), value: null });
    }
  }
  return { flags, positionals };
}

// "HOST:PORT" (HOST may be empty, a name, IPv4 or [IPv6]) -> {host, port}, else null.
export function hostPort(value) {
  if (typeof value !== "string") return null;
  const m = value.match(/^(\[[^\]]*\]|[^:]*):(\d{1,5})$/);
  if (!m) return null;
  const port = Number(m[2]);
  if (port < 1 || port > 65535) return null;
  return { host: m[1].replace(/^\[|\]$/g, ""), port };
}

// Flags that open a listening socket: --listen (the gRPC server) and --*-listen (such as
// --metrics-listen, the Prometheus exposer).
export function isListenerFlag(name) {
  return name === "listen" || name.endsWith("-listen");
}

// What a listener flag serves: gRPC for --listen (and the coordinator's plaintext
// --health-listen, which serves only health checks), HTTP for --metrics-listen.
export function listenerProtocol(name) {
  if (name === "listen" || name === "health-listen") return "grpc";
  if (name === "metrics-listen") return "http";
  return "tcp";
}

export function isLoopback(host) {
  return host === "localhost" || host === "::1" || /^127\./.test(host);
}
