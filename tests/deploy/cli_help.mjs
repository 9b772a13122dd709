// What a binary accepts, read from its own `--help` (CLI11's format), so that the manifests
// are checked against the flags the binaries really have.
import { spawnSync } from "node:child_process";
import { accessSync, constants } from "node:fs";
import path from "node:path";

// Parses help text into Map(flag name without dashes -> {required, default, choices}).
// An option line starts with its names ("-h,--help", "--listen"), then the value type,
// then markers: REQUIRED, a default ("TEXT=auto", or "[0.0.0.0:9464]" in older CLI11),
// choices in braces ("{auto,cpu,cuda}"). Flags mentioned only inside descriptions are not options.
export function parseHelp(text) {
  const flags = new Map();
  for (const line of text.split("\n")) {
    const m = line.match(/^\s{0,12}((?:-{1,2}[A-Za-z0-9][\w-]*(?:=\S*)?\s*,\s*)*-{1,2}[A-Za-z0-9][\w-]*(?:=\S*)?)(?=\s|$)(.*)$/);
    if (!m) continue;
    const rest = m[2];
    const info = { required: /\bREQUIRED\b/.test(rest), default: null, choices: null };
    // CLI11 2.3 prints a default after the type ("TEXT=auto"), older ones in brackets.
    const def = rest.match(/^\s+[A-Z][\w:{},.-]*=(\S+)/) ?? rest.match(/\[([^\]]*)\]/);
    if (def) info.default = def[1];
    const choices = rest.match(/\{([^}]*)\}/);
    if (choices) info.choices = choices[1].split(",").map((s) => s.trim()).filter(Boolean);
    for (const name of m[1].split(",")) {
      const n = name.trim().replace(/=.*$/, "");
      if (n.startsWith("--")) flags.set(n.slice(2), info);
    }
  }
  return flags;
}

// The subcommand names a help text lists under "Subcommands:".
export function parseSubcommands(text) {
  const m = text.match(/^Subcommands:\s*\n((?:[ \t]+\S.*\n?)*)/m);
  if (!m) return [];
  return m[1].split("\n").map((l) => l.match(/^\s{1,8}([a-z][\w-]*)(?:\s|$)/)?.[1]).filter(Boolean);
}

// Runs `BIN [SUBCOMMAND] --help` for binaries in one directory, once each. `help(name,
// subcommand)` returns {flags, subcommands, text} or throws when the binary is missing or
// its --help fails.
export function helpReader(binDir) {
  const cache = new Map();
  return function help(name, subcommand = null) {
    const key = `${name} ${subcommand ?? ""}`;
    if (cache.has(key)) return cache.get(key);
    const bin = path.join(binDir, name);
    try {
      accessSync(bin, constants.X_OK);
    } catch {
      throw new Error(`${bin} does not exist or is not executable (build it first)`);
    }
    const argv = subcommand === null ? ["--help"] : [subcommand, "--help"];
    const shown = `${bin} ${argv.join(" ")}`;
    const r = spawnSync(bin, argv, { encoding: "utf8", timeout: 20_000 });
    if (r.error) throw new Error(`${shown}: ${r.error.message}`);
    if (r.status !== 0) throw new Error(`${shown} exited ${r.status}: ${r.stderr.trim()}`);
    const text = r.stdout + r.stderr;
    const result = { flags: parseHelp(text), subcommands: parseSubcommands(text), text };
    if (result.flags.size === 0) throw new Error(`${shown} lists no options`);
    cache.set(key, result);
    return result;
  };
}
