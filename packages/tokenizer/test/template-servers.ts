// Preprocessors of Qwen3's vocabulary, each with a chat template of a test's own, and request bodies rendered
// through them as the EPP renders a body: read by the preprocessor's rules, then rendered with what it carries.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createPreprocessor, type Preprocessor, type PreprocessorOptions } from "../src/index";
import { parseBodyBytes } from "../src/request/openai-body";
import { qwen3TokenizerDir } from "./qwen3-fixture";

export class TemplateServers {
  private dirs = 0;
  private constructor(
    /** A temporary directory, removed by close(). */
    readonly root: string,
    /** Qwen3's tokenizer directory. */
    readonly source: string,
  ) {}

  static async open(prefix: string): Promise<TemplateServers> {
    return new TemplateServers(mkdtempSync(join(tmpdir(), prefix)), await qwen3TokenizerDir());
  }

  /** A preprocessor with `template` as its tokenizer's chat template, built with the server's `flags`. */
  server(template: string, flags: Omit<PreprocessorOptions, "tokenizerDir"> = {}): Preprocessor {
    const dir = join(this.root, `t${this.dirs++}`);
    mkdirSync(dir);
    symlinkSync(join(this.source, "tokenizer.json"), join(dir, "tokenizer.json"));
    const config = JSON.parse(readFileSync(join(this.source, "tokenizer_config.json"), "utf8"));
    writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({ ...config, chat_template: template }));
    return createPreprocessor({ tokenizerDir: dir, cache: false, ...flags });
  }

  close(): void {
    rmSync(this.root, { recursive: true, force: true });
  }
}

/** The chat a request body is, as the EPP reads it with `pre`'s rules. */
export function chatOf(pre: Preprocessor, body: Record<string, unknown>, path = "/v1/chat/completions") {
  const input = parseBodyBytes(new TextEncoder().encode(JSON.stringify(body)), path, pre.rules).input;
  if (input.kind !== "chat") throw new Error("not a chat");
  const { kind: _, messages, ...opts } = input;
  return { messages, opts };
}

/** A request body rendered as the EPP renders it. */
export function render(pre: Preprocessor, body: Record<string, unknown>, path = "/v1/chat/completions"): string {
  const { messages, opts } = chatOf(pre, body, path);
  return pre.renderChat(messages, opts);
}
