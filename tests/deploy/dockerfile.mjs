// A small Dockerfile parser: enough structure for the lint (dockerfile_lint.mjs) and for
// checking images against the Kubernetes manifests (check_manifests.mjs). It understands
// line continuations, comments, parser directives, ARG defaults before the first FROM,
// and the exec (JSON) and shell forms; not heredocs, which Boulder's Dockerfiles don't use.

// Splits the text into instructions: {line, keyword (upper case), rest (raw text)}.
export function instructions(text) {
  const out = [];
  const lines = text.split("\n");
  let current = null;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const trimmed = line.trim();
    if (current === null) {
      if (trimmed === "" || trimmed.startsWith("#")) continue;
      current = { line: i + 1, text: "" };
    } else if (trimmed.startsWith("#")) {
      continue;  // a comment inside a continued instruction
    }
    if (trimmed.endsWith("\\")) {
      current.text += trimmed.slice(0, -1) + " ";
      continue;
    }
    current.text += trimmed;
    const m = current.text.match(/^(\S+)\s*(.*)$/s);
    out.push({ line: current.line, keyword: m[1].toUpperCase(), rest: m[2].trim() });
    current = null;
  }
  if (current !== null) {
    throw new Error(`line ${current.line}: the file ends inside a continued instruction`);
  }
  return out;
}

// The JSON array of an exec-form instruction, or null for the shell form.
export function execForm(rest) {
  if (!rest.startsWith("[")) return null;
  try {
    const v = JSON.parse(rest);
    return Array.isArray(v) && v.every((x) => typeof x === "string") ? v : null;
  } catch {
    return null;
  }
}

// Replaces ${NAME} and $NAME with ARG values; unknown names are left as they are.
export function substitute(text, args) {
  return text.replace(/\$\{(\w+)\}|\$(\w+)/g, (whole, a, b) => {
    const name = a ?? b;
    return args.has(name) && args.get(name) !== undefined ? args.get(name) : whole;
  });
}

function parseArgDefault(rest) {
  const m = rest.match(/^(\w+)(?:=(.*))?$/);
  if (!m) return null;
  let value = m[2];
  if (value !== undefined && /^".*"$/.test(value)) value = value.slice(1, -1);
  return [m[1], value];
}

// Options of COPY/ADD/HEALTHCHECK: leading --name=value words.
function splitOptions(rest) {
  const options = {};
  let remaining = rest;
  for (;;) {
    const m = remaining.match(/^--([\w-]+)(?:=(\S*))?\s*(.*)$/s);
    if (!m) break;
    options[m[1]] = m[2] ?? true;
    remaining = m[3];
  }
  return { options, remaining };
}

// Parses a Dockerfile into global ARGs and stages. Each stage has its base image (ARGs
// substituted), its name, and what the lint and the checks need: runs, copies, exposed
// ports, user, entrypoint, cmd, healthcheck and shell.
export function parseDockerfile(text) {
  const globalArgs = new Map();
  const stages = [];
  let stage = null;
  for (const ins of instructions(text)) {
    if (ins.keyword === "FROM") {
      const { remaining } = splitOptions(ins.rest);
      const m = remaining.match(/^(\S+)(?:\s+AS\s+(\S+))?$/i);
      if (!m) throw new Error(`line ${ins.line}: cannot parse FROM ${ins.rest}`);
      stage = {
        index: stages.length,
        line: ins.line,
        rawFrom: m[1],
        from: substitute(m[1], globalArgs),
        name: m[2] ?? null,
        args: new Map(globalArgs),
        instructions: [],
        runs: [],
        copies: [],
        adds: [],
        workdirs: [],
        expose: [],
        user: null,
        entrypoint: null,
        cmd: null,
        healthcheck: null,
        shell: null,
      };
      stages.push(stage);
      continue;
    }
    if (stage === null) {
      if (ins.keyword === "ARG") {
        const kv = parseArgDefault(ins.rest);
        if (kv) globalArgs.set(kv[0], kv[1]);
      }
      continue;
    }
    stage.instructions.push(ins);
    switch (ins.keyword) {
      case "ARG": {
        const kv = parseArgDefault(ins.rest);
        if (kv) stage.args.set(kv[0], kv[1] ?? globalArgs.get(kv[0]));
        break;
      }
      case "RUN":
        stage.runs.push({ line: ins.line, command: ins.rest, shell: stage.shell });
        break;
      case "COPY":
      case "ADD": {
        const { options, remaining } = splitOptions(ins.rest);
        const words = execForm(remaining) ?? remaining.split(/\s+/);
        const entry = {
          line: ins.line,
          from: typeof options.from === "string" ? options.from : null,
          sources: words.slice(0, -1),
          dest: words[words.length - 1],
        };
        (ins.keyword === "COPY" ? stage.copies : stage.adds).push(entry);
        break;
      }
      case "WORKDIR":
        stage.workdirs.push({ line: ins.line, path: ins.rest });
        break;
      case "EXPOSE":
        for (const word of ins.rest.split(/\s+/)) {
          const m = word.match(/^(\d+)(?:\/(tcp|udp))?$/i);
          stage.expose.push(m ? Number(m[1]) : word);
        }
        break;
      case "USER":
        stage.user = { line: ins.line, value: ins.rest };
        break;
      case "ENTRYPOINT":
        stage.entrypoint = { line: ins.line, exec: execForm(ins.rest), raw: ins.rest };
        break;
      case "CMD":
        stage.cmd = { line: ins.line, exec: execForm(ins.rest), raw: ins.rest };
        break;
      case "SHELL":
        stage.shell = execForm(ins.rest);
        break;
      case "HEALTHCHECK": {
        const { options, remaining } = splitOptions(ins.rest);
        if (/^NONE$/i.test(remaining)) {
          stage.healthcheck = { line: ins.line, none: true, options };
        } else {
          const m = remaining.match(/^CMD\s+(.*)$/is);
          const command = m ? m[1] : "";
          stage.healthcheck = {
            line: ins.line,
            none: false,
            options,
            exec: execForm(command),
            raw: command,
          };
        }
        break;
      }
      default:
        break;
    }
  }
  return { globalArgs, stages };
}

// The absolute paths the final stage puts files at through COPY (a destination ending in
// "/" receives each source under its base name).
export function installedPaths(stage) {
  const paths = [];
  for (const c of stage.copies) {
    if (c.dest.endsWith("/")) {
      for (const s of c.sources) paths.push(c.dest + s.split("/").pop());
    } else {
      paths.push(c.dest);
    }
  }
  return paths;
}

// The image that runs: the last stage.
export function finalStage(parsed) {
  return parsed.stages[parsed.stages.length - 1];
}
