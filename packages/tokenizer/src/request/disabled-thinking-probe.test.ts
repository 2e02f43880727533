// The probe vLLM's Anthropic server runs on its renderer under the default "auto" (serving.py,
// _probe_disabled_thinking_effort), run here on the EPP's own renderer: the served template decides whether
// `thinking: {type: "disabled"}` becomes reasoning_effort "none" or "low".
import { beforeAll, describe, expect, test } from "bun:test";
import { qwen3TokenizerDir } from "../../test/qwen3-fixture";
import { createPreprocessor } from "../preprocessor";
import type { PreprocessorOptions } from "../types";
import { probeDisabledThinkingEffort } from "./disabled-thinking-probe";

let dir: string;
beforeAll(async () => {
  dir = await qwen3TokenizerDir();
}, 60_000);

const verdict = (opts: PreprocessorOptions = {}) => {
  const pre = createPreprocessor({ tokenizerDir: dir, ...opts, anthropicInlineSystem: "fold", anthropicDisabledThinkingEffort: "none" });
  return probeDisabledThinkingEffort((body) => {
    const { kind: _, messages, ...chat } = pre.rules.readChat(body);
    return pre.encodeChat(messages, chat);
  });
};

const QWEN3_THINKING_OFF = "enable_thinking is defined and enable_thinking is false";

/** Qwen3's template with its thinking switch replaced. */
const qwen3With = async (condition: string, prefix = "") => {
  const config = await Bun.file(`${dir}/tokenizer_config.json`).json();
  const template: string = config.chat_template;
  expect(template).toContain(QWEN3_THINKING_OFF);
  return prefix + template.replace(QWEN3_THINKING_OFF, condition);
};

describe("the disabled thinking probe", () => {
  // A reasoning_effort sets enable_thinking (false only for "none"), which Qwen3's generation prompt reads: "none"
  // renders an empty <think> block no effort renders.
  test("Qwen3's template turns thinking off for \"none\"", () => {
    expect(verdict()).toBe("none");
    // The default option runs it when the preprocessor is made; an effort given is taken as it is.
    expect(createPreprocessor({ tokenizerDir: dir }).rules.disabledThinkingEffort).toBe("none");
    expect(createPreprocessor({ tokenizerDir: dir, anthropicDisabledThinkingEffort: "medium" }).rules.disabledThinkingEffort).toBe("medium");
  }, 60_000);

  test("a template that refuses \"none\" gets \"low\"", async () => {
    const chatTemplate = await qwen3With(QWEN3_THINKING_OFF, `{% if reasoning_effort == "none" %}{{ raise_exception("no none") }}{% endif %}`);
    expect(verdict({ chatTemplate })).toBe("low");
  }, 60_000);

  test("a template that renders \"none\" as some effort gets \"low\"", async () => {
    // Thinking stays on unless the effort is one the template knows to be low.
    expect(verdict({ chatTemplate: await qwen3With(`reasoning_effort == "low"`) })).toBe("low");
    // Nor does a template that reads neither.
    expect(verdict({ chatTemplate: await qwen3With("false") })).toBe("low");
  }, 60_000);
});
