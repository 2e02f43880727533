// --help and the README's option tables, both written from the spec, so neither can drift from it.
import { envName, flagName, type Option, type Spec, type TextKind } from "./option.ts";
import type { Program } from "./resolve.ts";

const HINT: Record<TextKind, string> = { string: "S", int: "N", number: "X", bool: "[BOOL]", list: "A,B" };

/** The default as a reader types it; undefined when the option has none. */
export function defaultText(o: Option): string | undefined {
  const d = o.schema.safeParse(undefined);
  if (!d.success || d.data === undefined) return undefined;
  if (Array.isArray(d.data)) return d.data.length > 0 ? d.data.join(",") : undefined;
  return typeof d.data === "string" ? JSON.stringify(d.data) : String(d.data);
}

function groups(spec: Spec): Map<string, [string, Option][]> {
  const out = new Map<string, [string, Option][]>();
  for (const [key, o] of Object.entries(spec)) out.set(o.group, [...(out.get(o.group) ?? []), [key, o]]);
  return out;
}

export const PRECEDENCE = "flag > environment variable > config file > default";

const hint = (o: Option) => (o.values ? o.values.join("|") : HINT[o.kind]);

/** `usage: <command> [flags]`, then each section's flags: the flag, its variable and default, its help. */
export function usageText(spec: Spec, program: Program & { command: string; note?: string }): string {
  const lines = [`usage: ${program.command} [flags]`];
  if (program.note) lines.push(program.note);
  for (const [title, options] of groups(spec)) {
    lines.push("", `${title}:`);
    for (const [key, o] of options) {
      const env = envName(key, o, program.envPrefix);
      const def = defaultText(o);
      const aside = [env, def !== undefined ? `default ${def}` : undefined].filter((x) => x !== undefined).join(", ");
      lines.push(`  --${flagName(key)} ${hint(o)}${aside ? `  (${aside})` : ""}`, `      ${o.help}`);
    }
  }
  return lines.join("\n");
}

/** One Markdown table per section: flag, variable (and file key), default, meaning. */
export function optionsMarkdown(spec: Spec, program: Program): string {
  const out: string[] = [];
  for (const [title, options] of groups(spec)) {
    out.push(`#### ${title}`, "", "| flag | variable | default | meaning |", "|---|---|---|---|");
    const cell = (s: string) => s.replaceAll("|", "\\|");
    for (const [key, o] of options) {
      const env = envName(key, o, program.envPrefix);
      const def = defaultText(o);
      out.push(`| \`--${flagName(key)} ${cell(hint(o))}\` | ${env ? `\`${env}\`` : ""} | ${def !== undefined ? `\`${cell(def)}\`` : ""} | ${cell(o.help)} |`);
    }
    out.push("");
  }
  return out.join("\n").trimEnd() + "\n";
}

/** Replaces what stands between `<!-- options:begin -->` and `<!-- options:end -->` in a README's text. */
export function withOptionsSection(readme: string, markdown: string): string {
  const begin = "<!-- options:begin -->";
  const end = "<!-- options:end -->";
  const a = readme.indexOf(begin);
  const b = readme.indexOf(end);
  if (a < 0 || b < a) throw new Error(`the README has no ${begin} ... ${end} section`);
  return `${readme.slice(0, a + begin.length)}\n${markdown}${readme.slice(b)}`;
}
