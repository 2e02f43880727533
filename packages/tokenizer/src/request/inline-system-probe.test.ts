// The probe vLLM's Anthropic server runs on its renderer under the default "auto" (inline_system.py, _Prober), run
// here on the EPP's own renderer: the served template decides between keeping inline system messages and folding them.
import { beforeAll, describe, expect, test } from "bun:test";
import { qwen3TokenizerDir } from "../../test/qwen3-fixture";
import { cp, mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createPreprocessor, settledMessagesOptions } from "../preprocessor";
import type { PreprocessorOptions } from "../types";
import type { HfPreprocessor } from "../hf-preprocessor";
import { adoptTokenizerFiles, loadTokenizerFiles, shareTokenizerFiles } from "../tokenizer-files";
import { insertion, probeInlineSystem } from "./inline-system-probe";

let dir: string;
beforeAll(async () => {
  dir = await qwen3TokenizerDir();
}, 60_000);

const verdict = (opts: PreprocessorOptions = {}) => {
  const pre = createPreprocessor({ tokenizerDir: dir, ...opts, anthropicInlineSystem: "fold" }) as HfPreprocessor;
  return probeInlineSystem({
    encodeBody: (body) => {
      const { kind: _, messages, ...chat } = pre.rules.readChat(body);
      return pre.encodeChat(messages, chat);
    },
    decode: (ids) => pre.decode(ids),
    markerIds: pre.markerIds,
  });
};

/** Qwen3's template with one change. */
const qwen3With = async (from: string, to: string) => {
  const config = await Bun.file(`${dir}/tokenizer_config.json`).json();
  const template: string = config.chat_template;
  expect(template).toContain(from);
  return template.replace(from, to);
};

describe("the inline system probe", () => {
  test("insertion finds the one span that turns a render into another", () => {
    expect(insertion([1, 2, 3], [1, 2, 9, 9, 3])).toEqual({ at: 2, span: [9, 9] });
    expect(insertion([1, 2, 3], [1, 2, 3, 4])).toEqual({ at: 3, span: [4] });
    // A span whose ends repeat what surrounds it is found at the first place it fits.
    expect(insertion([1, 2, 1], [1, 2, 1, 2, 1])).toEqual({ at: 3, span: [2, 1] });
    expect(insertion([1, 2, 3], [1, 5, 3, 4])).toBeUndefined();
    expect(insertion([1, 2, 3], [1, 3])).toBeUndefined();
  });

  // Qwen3 renders a system message that is not first as "<|im_start|>system\n...<|im_end|>\n" where it stands, and
  // picks the turn whose reasoning it keeps by the last *user* message, which a system message is not. So in each
  // probe chat the inline message is one inserted span holding the <|im_start|>/<|im_end|> added tokens, before the
  // generation prompt ("<|im_start|>" is shared, the span starts at its "system"), unlike a user message's span, and
  // the after-tool assistant keeps its reasoning either way. Qwen3 reads no reasoning_effort, so the renders without
  // one are the same and are not checked again. vLLM's probe therefore keeps them: "preserve".
  test("Qwen3's template keeps inline system messages in place", () => {
    expect(verdict()).toEqual({ mode: "preserve", reason: "the renderer marks them as distinct system turns" });
    // The default option runs it when the preprocessor is made; a mode given is taken as it is.
    expect(createPreprocessor({ tokenizerDir: dir }).rules.inlineSystem).toBe("preserve");
    expect(createPreprocessor({ tokenizerDir: dir, anthropicInlineSystem: "fold" }).rules.inlineSystem).toBe("fold");
    // A pool member's, made from the files as shared between threads, reaches it too.
    const member = createPreprocessor({ tokenizerDir: dir }, adoptTokenizerFiles(shareTokenizerFiles(loadTokenizerFiles(dir))));
    expect(member.rules.inlineSystem).toBe("preserve");
  }, 60_000);

  test("a template that prints only the first system message drops it", async () => {
    const chatTemplate = await qwen3With(`(message.role == "system" and not loop.first)`, "false");
    expect(verdict({ chatTemplate })).toEqual({ mode: "fold", reason: "mid: renderer drops it (reasoning_effort=high)" });
  }, 60_000);

  test("a template that renders a later system message as a user's", async () => {
    const chatTemplate = await qwen3With(`{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}`, `{{- '<|im_start|>user\\n' + message.content + '<|im_end|>' + '\\n' }}`);
    expect(verdict({ chatTemplate })).toEqual({ mode: "fold", reason: "mid: it renders the same as a user message (reasoning_effort=high)" });
  }, 60_000);

  test("a template that keeps reasoning only after the last user or system message", async () => {
    // The system message after the tool result drops the assistant's <think> block: the render changes before the
    // inserted message, which is checked before which reasoning is kept.
    const chatTemplate = await qwen3With(`message.role == "user" and not(`, `message.role in ["user", "system"] and not(`);
    expect(verdict({ chatTemplate })).toEqual({ mode: "fold", reason: "after_tool: rendering it changes other parts of the prompt (reasoning_effort=high)" });
  }, 60_000);

  test("a template that refuses every probe chat", async () => {
    const chatTemplate = `{{ raise_exception("no") }}`;
    expect(verdict({ chatTemplate })).toEqual({ mode: "fold", reason: "the probe conversations could not be rendered" });
  }, 60_000);

  // The probe reads the marker ids off tokenizer_config.json: one that cannot give them (additional_special_tokens
  // not a list) is no reason to refuse the tokenizer directory, only to keep the modes vLLM takes when it cannot tell.
  test("a probe that cannot be prepared keeps the unprobed modes, and says so once", async () => {
    const broken = await mkdtemp(join(tmpdir(), "probe-"));
    await cp(dir, broken, { recursive: true });
    const config = await Bun.file(`${dir}/tokenizer_config.json`).json();
    await writeFile(join(broken, "tokenizer_config.json"), JSON.stringify({ ...config, additional_special_tokens: { content: "<|im_start|>" } }));
    const warned: object[] = [];
    const pre = createPreprocessor({ tokenizerDir: broken, log: { warn: (obj) => warned.push(obj) } });
    expect(pre.rules.inlineSystem).toBe("fold");
    expect(pre.rules.disabledThinkingEffort).toBe("low");
    expect(warned).toHaveLength(1);
  }, 60_000);

  test("settledMessagesOptions hands on the probed modes as options that need no probe", () => {
    const settle = (opts: PreprocessorOptions): PreprocessorOptions => settledMessagesOptions(opts);
    expect(settle({ tokenizerDir: dir })).toEqual({ tokenizerDir: dir, anthropicInlineSystem: "preserve", anthropicDisabledThinkingEffort: "none" });
    // Under SGLang's rules there is nothing to settle; without a directory, the unprobed modes.
    expect(settle({ tokenizerDir: dir, chatRendering: "sglang" })).toEqual({ tokenizerDir: dir, chatRendering: "sglang" });
    expect(settle({})).toEqual({ anthropicInlineSystem: "fold", anthropicDisabledThinkingEffort: "low" });
  }, 60_000);
});
