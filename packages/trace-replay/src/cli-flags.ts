// `--flag value` / `--flag=value` command lines validated by a zod object schema, for the bench and the
// demo; a bad value is reported with the flag's name.
import type { z } from "zod";

export class FlagError extends Error {
  override name = "FlagError";
}

/**
 * Parses argv against `schema`'s keys (the flag names). A bare argument goes to `positional` when one is
 * named, and is an error otherwise. A flag in `switches` given without `=value` is "true" (`--pd`).
 */
export function parseFlags<S extends z.ZodObject>(schema: S, argv: string[], positional?: keyof z.input<S> & string, switches: readonly string[] = []): z.output<S> {
  const raw: Record<string, string> = {};
  const known = Object.keys(schema.shape);
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const m = /^--([a-z-]+)(?:=(.*))?$/s.exec(arg);
    if (!m) {
      if (!positional) throw new FlagError(`unexpected argument ${JSON.stringify(arg)}; flags: ${known.map((k) => `--${k}`).join(" ")}`);
      raw[positional] = arg;
      continue;
    }
    const flag = m[1]!;
    if (!known.includes(flag)) throw new FlagError(`unknown flag --${flag}; flags: ${known.map((k) => `--${k}`).join(" ")}`);
    const value = m[2] ?? (switches.includes(flag) ? "true" : argv[++i]);
    if (value === undefined) throw new FlagError(`--${flag} needs a value`);
    raw[flag] = value;
  }
  const parsed = schema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const flag = String(issue.path[0]);
    throw new FlagError(`invalid --${flag} ${JSON.stringify(raw[flag])}: ${issue.message}`);
  }
  return parsed.data;
}
