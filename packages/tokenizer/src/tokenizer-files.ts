import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import { adoptModel, parseTokenizerJson, shareModel, type SharedModel } from "./fast/bpe-model";
import { isByteLevel } from "./fast/whole-words";

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

/** The tokenizer's chat template: one, or several by name (transformers' `tokenizer.chat_template`, a str or a dict). */
export type ChatTemplates = string | Readonly<Record<string, string>>;
/**
 * A tokenizer directory as read: the tokenizer's files, its chat templates, a multimodal processor's own template
 * (vLLM prefers it for a chat without tools), and what says which of vLLM's renderers serves the model.
 */
export type TokenizerFiles = {
  tokenizerJson: TokenizerJson;
  config: TokenizerConfig;
  chatTemplate: ChatTemplates | null;
  processorChatTemplate: string | null;
  modelFiles: ModelFiles;
};

/** config.json's model_type and architectures (undefined without the file), and whether Mistral's own tokenizer files are there. */
export type ModelFiles = { modelType?: unknown; architectures?: unknown; mistralTokenizer: boolean };

// readFileSync(path, "utf8")'s text (a BOM kept), decoded from the file mapped rather than read: Qwen3's 11 MB
// tokenizer.json in a fresh process took ~116 ms read and decoded, ~72 mapped and decoded. What cannot be mapped
// (an empty file, a directory) is read as before, failing as before. A file cut short in place while mapped would
// fault the process; tokenizer directories are replaced whole (image layers; a ConfigMap volume swaps a symlink).
function readMapped(path: string): string {
  let bytes: Uint8Array;
  try {
    bytes = Bun.mmap(path, { shared: false });
  } catch {
    return readFileSync(path, "utf8");
  }
  return UTF8.decode(bytes);
}
const UTF8 = new TextDecoder("utf-8", { ignoreBOM: true });

/** Reads a Hugging Face tokenizer directory from local disk; nothing is fetched. Throws naming the missing file. */
export function loadTokenizerFiles(dir: string): TokenizerFiles {
  const path = (name: string) => {
    const p = join(dir, name);
    if (!existsSync(p)) throw new Error(`tokenizer dir ${dir}: ${name} not found`);
    return p;
  };
  const tokenizerJson = parseTokenizerJson(readMapped(path("tokenizer.json"))) as TokenizerJson;
  const config = JSON.parse(readFileSync(path("tokenizer_config.json"), "utf8")) as TokenizerConfig;
  return { tokenizerJson, config, chatTemplate: findChatTemplate(dir, config), processorChatTemplate: findProcessorChatTemplate(dir), modelFiles: readModelFiles(dir) };
}

/**
 * A tokenizer directory as read once, for other threads (posted as workerData): the model's tables in shared memory
 * (see shareModel), the rest of the files as they are, copied (small beside the tables: Gemma 3's 6k added tokens the most).
 */
export type SharedTokenizerFiles = Omit<TokenizerFiles, "tokenizerJson"> & { tokenizerJson: Omit<TokenizerJson, "model">; model: SharedModel | null };

export function shareTokenizerFiles(files: TokenizerFiles): SharedTokenizerFiles {
  const { model, ...rest } = files.tokenizerJson;
  return { ...files, tokenizerJson: rest as Omit<TokenizerJson, "model">, model: model == null ? null : shareModel(model as Record<string, unknown>, isByteLevel(rest.pre_tokenizer as never)) };
}

/** The files a SharedTokenizerFiles was made of; the model's tables are the shared ones, never written. */
export function adoptTokenizerFiles(shared: SharedTokenizerFiles): TokenizerFiles {
  const tokenizerJson = { ...shared.tokenizerJson } as TokenizerJson;
  if (shared.model !== null) tokenizerJson.model = adoptModel(shared.model);
  const { model: _, ...files } = shared;
  return { ...files, tokenizerJson };
}

// As transformers' tokenizer from_pretrained reads them: chat_template.jinja (the "default") and
// additional_chat_templates/*.jinja (by file name) replace whatever the config holds, one file alone being the
// template itself; else the config's chat_template, a string or a list of named templates.
function findChatTemplate(dir: string, config: TokenizerConfig): ChatTemplates | null {
  const files: Record<string, string> = {};
  for (const f of extraTemplateFiles(dir)) files[f.slice(0, -".jinja".length)] = readFileSync(join(dir, EXTRA_TEMPLATES, f), "utf8");
  const jinjaPath = join(dir, "chat_template.jinja");
  if (existsSync(jinjaPath)) files.default = readFileSync(jinjaPath, "utf8");
  const names = Object.keys(files);
  if (names.length === 1 && files.default !== undefined) return files.default;
  if (names.length > 0) return files;
  const t = config.chat_template;
  if (typeof t === "string") return t;
  if (Array.isArray(t)) return Object.fromEntries(t.map((x) => [x.name, x.template]));
  return null;
}

const EXTRA_TEMPLATES = "additional_chat_templates";

function extraTemplateFiles(dir: string): string[] {
  const extra = join(dir, EXTRA_TEMPLATES);
  return existsSync(extra) && statSync(extra).isDirectory() ? readdirSync(extra).filter((f) => f.endsWith(".jinja")) : [];
}

/**
 * The files a multimodal processor loads its image, video or audio half from. vLLM takes a processor's template only
 * when AutoProcessor gives a ProcessorMixin, which needs one of them: without, it falls back to the tokenizer (or
 * fails to load the processor's other half), and the template is the tokenizer's. A processor class named in
 * tokenizer_config.json or config.json, or given by the model type, does not load without them either.
 */
const PROCESSOR_FILES = ["processor_config.json", "preprocessor_config.json", "video_preprocessor_config.json"];

/**
 * A multimodal processor's own template, as ProcessorMixin.get_processor_dict reads it: chat_template.json (its
 * legacy file) wins, refused beside additional_chat_templates/ (no processor then); then the .jinja files (the
 * tokenizer's too: null here, the tokenizer's pick stands); then processor_config.json's chat_template. Only a single
 * template counts; a directory without such files, or without a processor (PROCESSOR_FILES), has none.
 */
function findProcessorChatTemplate(dir: string): string | null {
  if (!PROCESSOR_FILES.some((f) => existsSync(join(dir, f)))) return null;
  const extra = extraTemplateFiles(dir).length > 0;
  const legacy = readJson(join(dir, "chat_template.json"));
  if (legacy !== undefined) return !extra && typeof legacy.chat_template === "string" ? legacy.chat_template : null;
  if (extra || existsSync(join(dir, "chat_template.jinja"))) return null;
  const config = readJson(join(dir, "processor_config.json"));
  return typeof config?.chat_template === "string" ? config.chat_template : null;
}

/**
 * What vLLM reads to pick its renderer (renderers/registry.py): config.json's model_type and architectures, and the
 * files that make its "auto" tokenizer mode Mistral's (tekken.json, tokenizer.model.v*). Read once per directory:
 * the startup warning (servedVllmRenderer) and the preprocessor both ask, and the search walks the whole directory.
 */
export function readModelFiles(dir: string): ModelFiles {
  const key = resolve(dir);
  let files = modelFilesRead.get(key);
  if (files === undefined) {
    const config = readJson(join(dir, "config.json"));
    const mistralTokenizer = hasMistralTokenizer(dir);
    files = config === undefined ? { mistralTokenizer } : { modelType: config.model_type, architectures: config.architectures, mistralTokenizer };
    modelFilesRead.set(key, files);
  }
  return files;
}
const modelFilesRead = new Map<string, ModelFiles>();

/**
 * A Mistral tokenizer file anywhere under `dir`, as vLLM looks for one (list_repo_files of a local directory: every
 * file under it, each matched by its base name). A link to a file counts, as in a Hugging Face cache's snapshot.
 */
function hasMistralTokenizer(dir: string): boolean {
  for (const e of readdirSync(dir, { recursive: true, withFileTypes: true })) {
    if (e.name !== "tekken.json" && !e.name.startsWith("tokenizer.model.v")) continue;
    if (e.isFile() || (e.isSymbolicLink() && statSync(join(e.parentPath, e.name), { throwIfNoEntry: false })?.isFile())) return true;
  }
  return false;
}

/**
 * A JSON object file's fields; undefined when the file is absent or holds no object. A file that does not parse is
 * none too: vLLM finds no processor in it (its loading errors are swallowed), and reads no model type.
 */
function readJson(path: string): Record<string, unknown> | undefined {
  if (!existsSync(path)) return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(readFileSync(path, "utf8"));
  } catch {
    return undefined;
  }
  return typeof parsed === "object" && parsed !== null && !Array.isArray(parsed) ? (parsed as Record<string, unknown>) : undefined;
}

/**
 * vLLM's `--chat-template` value as it loads it (_load_chat_template): the text of the file it names when that
 * opens (read in text mode), else, if it holds a `{`, `}` or newline, the template itself; else it was meant as a
 * path (vLLM also looks in its own chat_templates directory, which is not here) and is refused.
 */
export function loadChatTemplate(value: string): string {
  try {
    return readTextMode(value);
  } catch (err) {
    if (![..."{}\n"].some((c) => value.includes(c)))
      throw new Error(`the chat template ${JSON.stringify(value)} looks like a file path, but it failed to be opened: ${(err as Error).message}`);
    return value;
  }
}

/**
 * SGLang's `--chat-template` as TemplateManager loads it (_load_explicit_chat_template, _load_jinja_template): a
 * `.jinja` file's text, its leading and trailing newlines stripped and each literal `\n` made a newline. Anything
 * else is one of SGLang's own conversation templates (a built-in name, or a JSON file), not rendered here
 * (sglang-conversation.ts): refused.
 */
export function loadSglangChatTemplate(value: string): string {
  if (!value.endsWith(".jinja"))
    throw new Error(`SGLang takes the chat template ${JSON.stringify(value)} as one of its own conversation templates (a name or a JSON file), which is not rendered here: give a .jinja file`);
  return readTextMode(value).replace(/^\n+|\n+$/g, "").replaceAll("\\n", "\n");
}

/** A file as Python's `open(path).read()` gives it: text mode reads each `\r\n` and lone `\r` as `\n`. */
function readTextMode(path: string): string {
  return readFileSync(path, "utf8").replace(/\r\n?/g, "\n");
}

/**
 * The template a request renders with (transformers' get_chat_template, which vLLM calls with the request's tools):
 * of named templates, "tool_use" for a request with tools when there is one, else "default"; null when none applies.
 */
export function pickChatTemplate(t: ChatTemplates | null, hasTools: boolean): { name: string; source: string } | null {
  if (t === null) return null;
  if (typeof t === "string") return { name: "default", source: t };
  const name = hasTools && t.tool_use !== undefined ? "tool_use" : "default";
  const source = t[name];
  return source === undefined ? null : { name, source };
}

export function tokenContent(v: TokenValue): string | null {
  if (v === null || v === undefined) return null;
  return typeof v === "string" ? v : v.content;
}
