// An option declared once: its typed schema (with the default, or optional), its help, its section of
// --help. Its names follow from its key: the flag is the key in kebab-case, the environment variable the
// program's prefix and the key in SNAKE_CASE, the config-file key is the key itself.
import { z } from "zod";

/** How a flag's or a variable's text becomes a value before the option's schema checks it. */
export type TextKind = "string" | "int" | "number" | "bool" | "list";

export type Option<S extends z.ZodType = z.ZodType> = {
  readonly kind: TextKind;
  readonly schema: S;
  readonly help: string;
  /** The section of --help and of the README the option is listed in. */
  readonly group: string;
  /** Only where a deployed name predates the rule (POD_IP, POD_NAMESPACE, ...). */
  readonly env?: string;
  /** The values a choice takes, for --help. */
  readonly values?: readonly string[];
};

/** A program's options by key (camelCase). */
export type Spec = Record<string, Option>;
/** The typed values of a spec: each option's schema output (its default applied). */
export type Values<S extends Spec> = { -readonly [K in keyof S]: z.output<S[K]["schema"]> };

type Entry<S extends z.ZodType = z.ZodType> = Omit<Option<S>, "group">;
const entry =
  (kind: TextKind) =>
  <S extends z.ZodType>(schema: S, help: string, names: { env?: string } = {}): Entry<S> => ({ kind, schema, help, ...names });

/** Builders by how the option reads text: `opt.int(port.default(9002), "ext_proc gRPC port")`. */
export const opt = {
  string: entry("string"),
  int: entry("int"),
  number: entry("number"),
  bool: entry("bool"),
  /** Comma-separated on the command line, a list in a file. */
  list: entry("list"),
  /** One of `values`: `opt.choice(["auto", "buffered"], "auto", "body mode")`. */
  choice: <const T extends readonly [string, ...string[]]>(values: T, def: T[number], help: string) => ({
    kind: "string" as const,
    schema: oneOf(values).default(def as never) as z.ZodDefault<z.ZodEnum<{ [K in T[number]]: K }>>,
    help,
    values,
  }),
};

/** Puts options in one section of --help: `{ ...group("Servers", { grpcPort: opt.int(...) }) }`. */
export function group<const O extends Record<string, Entry>>(title: string, options: O): { [K in keyof O]: O[K] & { readonly group: string } } {
  return Object.fromEntries(Object.entries(options).map(([k, o]) => [k, { ...o, group: title }])) as { [K in keyof O]: O[K] & { readonly group: string } };
}

/** Timers wrap past 2^31-1 ms and fire at once: bounds every integer option, milliseconds included. */
const INT_MAX = 2 ** 31 - 1;
export const count = z.number().int().min(0).max(INT_MAX);
export const positive = z.number().int().min(1).max(INT_MAX);
export const port = z.number().int().min(0).max(65535);
export const nonNegative = z.number().min(0);
/**
 * A JSON object, kept as its text (its reader may parse it its own way: a template's kwargs keep `1.0` a float):
 * text on the command line or in a variable, checked to be an object; an object in a config file, written as JSON.
 */
export const jsonObjectText = z.union([z.string(), z.record(z.string(), z.unknown())]).transform((v, ctx) => {
  if (typeof v !== "string") return JSON.stringify(v);
  try {
    const parsed: unknown = JSON.parse(v);
    if (typeof parsed === "object" && parsed !== null && !Array.isArray(parsed)) return v;
  } catch {
    // worded below, as for any value that is no object
  }
  ctx.addIssue({ code: "custom", message: "expected a JSON object" });
  return z.NEVER;
});

/** One of `values`; a wrong one reads "expected a|b". */
export const oneOf = <const T extends readonly [string, ...string[]]>(values: T) => z.enum(values, { error: `expected ${values.join("|")}` });

export const flagName = (key: string): string => key.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
export const envName = (key: string, o: Option, prefix: string | undefined): string | undefined =>
  o.env ?? (prefix === undefined ? undefined : `${prefix}${key.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase()}`);
