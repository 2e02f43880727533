// The one rule every option of every program resolves by: the flag wins over the environment variable,
// which wins over the config file (or the options a library caller passes), which wins over the default.
// Every value, whatever its source, goes through the option's one schema; a bad one is reported with its
// source (the flag, the variable, the file's key) and its text.
import type { z } from "zod";
import { envName, flagName, type Option, type Spec, type TextKind, type Values } from "./option.ts";

export class ConfigError extends Error {
  override name = "ConfigError";
}

/** What a program calls its own: `envPrefix` DYN_EPP_ gives DYN_EPP_GRPC_PORT; none: flags only. */
export type Program = { envPrefix?: string; positional?: string };

/** Values under the environment: a config file (label `--config "epp.yaml"`), or a library caller's options. */
export type Layer = { label: string; values: Record<string, unknown> };

export type Inputs = { argv?: readonly string[]; env?: Record<string, string | undefined>; file?: Layer };

export type Resolved<S extends Spec> = {
  values: Values<S>;
  /** Where a value came from, as an error message names it: `--grpc-port`, `DYN_EPP_GRPC_PORT (--grpc-port)`, ... */
  source(key: keyof S & string): string;
  /** Throws a ConfigError naming the option's source and value: for rules across options. */
  fail(key: keyof S & string, reason: string): never;
};

type Given = { raw: unknown; source: string; text: boolean };

const INT = /^[+-]?\d+$/;
// Decimal digits only: Number() would also take "", " ", "0x10" and "1e3".
const NUMBER = /^[+-]?(\d+(\.\d*)?|\.\d+)$/;
const BOOLS: Record<string, boolean> = { true: true, false: false, "1": true, "0": false, yes: true, no: false };

function fromText(kind: TextKind, text: string): { ok: true; value: unknown } | { ok: false; reason: string } {
  switch (kind) {
    case "string":
      return { ok: true, value: text };
    case "int":
      return INT.test(text) ? { ok: true, value: Number(text) } : { ok: false, reason: "expected an integer" };
    case "number":
      return NUMBER.test(text) ? { ok: true, value: Number(text) } : { ok: false, reason: "expected a number" };
    case "bool":
      return text in BOOLS ? { ok: true, value: BOOLS[text] } : { ok: false, reason: "expected true|false" };
    case "list":
      return { ok: true, value: text.split(",").map((x) => x.trim()).filter((x) => x.length > 0) };
  }
}

/** `--name value`, `--name=value`, and a bare boolean flag (`--explain`) meaning true. */
function readArgv(spec: Spec, program: Program, argv: readonly string[]): Map<string, Given> {
  const byFlag = new Map(Object.keys(spec).map((k) => [flagName(k), k]));
  const out = new Map<string, Given>();
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const m = /^--([a-z0-9-]+)(?:=(.*))?$/s.exec(arg);
    if (!m) {
      if (program.positional === undefined) throw new ConfigError(`unexpected argument ${JSON.stringify(arg)} (see --help)`);
      out.set(program.positional, { raw: arg, source: `argument ${JSON.stringify(arg)}`, text: true });
      continue;
    }
    const key = byFlag.get(m[1]!);
    if (key === undefined) throw new ConfigError(`unknown argument ${JSON.stringify(arg)} (see --help)`);
    let value = m[2];
    if (value === undefined) {
      // The next argument is the value unless it is a flag: `--kv-topic --listen ...` is a missing value.
      const next = argv[i + 1];
      const flagNext = next === undefined || next.startsWith("--");
      if (spec[key]!.kind === "bool" && flagNext) value = "true";
      else if (flagNext) throw new ConfigError(`--${m[1]} needs a value`);
      else value = argv[++i];
    }
    out.set(key, { raw: value, source: `--${m[1]}`, text: true });
  }
  return out;
}

function failure(source: string, raw: unknown, reason: string): ConfigError {
  return new ConfigError(`invalid value for ${source}: ${JSON.stringify(raw)} (${reason})`);
}

function check(key: string, o: Option, g: Given | undefined): unknown {
  if (g === undefined) {
    const d = o.schema.safeParse(undefined); // the default, or undefined when optional
    if (!d.success) throw new ConfigError(`--${flagName(key)} is required`);
    return d.data;
  }
  let value = g.raw;
  // A file or a caller gives typed values; a string there is read like a flag's text (YAML "9002").
  if (typeof g.raw === "string" && (g.text || o.kind !== "string")) {
    const read = fromText(o.kind, g.raw);
    if (!read.ok) throw failure(g.source, g.raw, read.reason);
    value = read.value;
  }
  const parsed = (o.schema as z.ZodType).safeParse(value);
  if (!parsed.success) throw failure(g.source, g.raw, parsed.error.issues.map((i) => i.message).join("; "));
  return parsed.data;
}

/** Resolves every option of `spec` by the one rule; throws ConfigError on an unknown flag or key, or a bad value. */
export function resolveOptions<S extends Spec>(spec: S, program: Program, inputs: Inputs): Resolved<S> {
  const args = readArgv(spec, program, inputs.argv ?? []);
  if (inputs.file)
    for (const k of Object.keys(inputs.file.values))
      if (!(k in spec)) throw new ConfigError(`unknown option ${JSON.stringify(k)} in ${inputs.file.label}`);
  const given = new Map<string, Given>();
  for (const [key, o] of Object.entries(spec)) {
    const env = envName(key, o, program.envPrefix);
    const fromEnv = env === undefined ? undefined : inputs.env?.[env];
    const g: Given | undefined =
      args.get(key) ??
      // An empty variable is an unset one (a manifest's `value: ""`).
      (fromEnv !== undefined && fromEnv !== "" ? { raw: fromEnv, source: `${env} (--${flagName(key)})`, text: true } : undefined) ??
      (inputs.file && inputs.file.values[key] !== undefined ? { raw: inputs.file.values[key], source: `${key} in ${inputs.file.label}`, text: false } : undefined);
    if (g) given.set(key, g);
  }
  const values: Record<string, unknown> = {};
  // Every value is checked before any rule across options, so the first message names the bad one.
  for (const [key, o] of Object.entries(spec)) values[key] = check(key, o, given.get(key));
  const source = (key: string) => given.get(key)?.source ?? `--${flagName(key)} default`;
  return {
    values: values as Values<S>,
    source,
    fail: (key, reason) => {
      throw failure(source(key), given.get(key)?.raw ?? values[key], reason);
    },
  };
}
