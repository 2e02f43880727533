import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";

export type AddedTokenJson = {
  id: number; content: string; special: boolean;
  lstrip?: boolean; rstrip?: boolean; single_word?: boolean; normalized?: boolean;
};
export type TokenizerJson = { added_tokens: AddedTokenJson[]; normalizer: unknown; [k: string]: unknown };
type TokenValue = string | { content: string } | null | undefined;
export type TokenizerConfig = {
  chat_template?: string | { name: string; template: string }[];
  bos_token?: TokenValue; eos_token?: TokenValue; unk_token?: TokenValue; pad_token?: TokenValue;
  additional_special_tokens?: TokenValue[];
  add_bos_token?: boolean; add_eos_token?: boolean;
  [k: string]: unknown;
};

export type TokenizerFiles = { tokenizerJson: TokenizerJson; config: TokenizerConfig; chatTemplate: string | null };

/** Reads a Hugging Face tokenizer directory from local disk; nothing is fetched. Throws naming the missing file. */
export function loadTokenizerFiles(dir: string): TokenizerFiles {
  const read = (name: string) => {
    const path = join(dir, name);
    if (!existsSync(path)) throw new Error(`tokenizer dir ${dir}: ${name} not found`);
    return JSON.parse(readFileSync(path, "utf8"));
  };
  const tokenizerJson = read("tokenizer.json") as TokenizerJson;
  const config = read("tokenizer_config.json") as TokenizerConfig;
  return { tokenizerJson, config, chatTemplate: findChatTemplate(dir, config) };
}

// Newer Hugging Face repos keep the template beside the config (chat_template.jinja, or chat_template.json)
// instead of inside it; transformers reads all three, so do we. A named-template list uses "default".
function findChatTemplate(dir: string, config: TokenizerConfig): string | null {
  const t = config.chat_template;
  if (typeof t === "string") return t;
  if (Array.isArray(t)) return t.find((x) => x.name === "default")?.template ?? null;
  const jinjaPath = join(dir, "chat_template.jinja");
  if (existsSync(jinjaPath)) return readFileSync(jinjaPath, "utf8");
  const jsonPath = join(dir, "chat_template.json");
  if (existsSync(jsonPath)) {
    const j = JSON.parse(readFileSync(jsonPath, "utf8")) as { chat_template?: unknown };
    if (typeof j.chat_template === "string") return j.chat_template;
  }
  return null;
}

export function tokenContent(v: TokenValue): string | null {
  if (v === null || v === undefined) return null;
  return typeof v === "string" ? v : v.content;
}
