// Which chat template a tokenizer directory gives a request, as transformers loads it (tokenizer from_pretrained) and
// picks it (get_chat_template, which vLLM calls with the request's tools). Each case is a directory of Qwen3's
// tokenizer.json with template files and a config written for it.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ChatTemplateError, ChatUnrenderable } from "../src/messages";
import { createPreprocessor, servedVllmRenderer, type Preprocessor, type PreprocessorOptions } from "../src/index";
import { qwen3TokenizerDir } from "./qwen3-fixture";

// The default renders the content as a string; the tool-use template loops over the content's parts, so a request
// with tools also gets that template's content format (vLLM's, detected on the template it resolved).
const DEFAULT = "D{% for m in messages %}[{{ m.content }}]{% endfor %}";
const TOOL_USE = "T{{ tools | length }}{% for m in messages %}{% for p in m.content %}({{ p.text }}){% endfor %}{% endfor %}";
const messages = [{ role: "user", content: "hi" }];
/** What makes a directory's processor load (its image half), beside its template files. */
const IMAGE_PROCESSOR = { "preprocessor_config.json": JSON.stringify({ image_processor_type: "Qwen2VLImageProcessor" }) };
const tools = [{ type: "function", function: { name: "f" } }];

let root: string;
let source: string;
beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "chat-template-files-"));
  source = await qwen3TokenizerDir();
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** A tokenizer dir: Qwen3's tokenizer.json and config, the config's chat_template replaced, plus `files`, served with `flags`. */
function tokenizerDir(name: string, chatTemplate: unknown, files: Record<string, string> = {}, flags: PreprocessorOptions = {}): Preprocessor {
  const dir = join(root, name);
  mkdirSync(dir);
  symlinkSync(join(source, "tokenizer.json"), join(dir, "tokenizer.json"));
  const config = JSON.parse(readFileSync(join(source, "tokenizer_config.json"), "utf8"));
  if (chatTemplate === undefined) delete config.chat_template;
  else config.chat_template = chatTemplate;
  writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(config));
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(join(dir, path, ".."), { recursive: true });
    writeFileSync(join(dir, path), text);
  }
  return createPreprocessor({ tokenizerDir: dir, cache: false, ...flags });
}

describe("the chat template a tokenizer directory gives a request", () => {
  test("chat_template.jinja wins over the config's chat_template", () => {
    const pre = tokenizerDir("jinja-over-config", "C{{ messages | length }}", { "chat_template.jinja": DEFAULT });
    expect(pre.renderChat(messages)).toBe("D[hi]");
    expect(pre.renderChat(messages, { tools })).toBe("D[hi]");
  });

  test("a template's CRLF and lone CR are newlines, as jinja2's lexer writes them (a .jinja file, a config's string)", () => {
    const crlf = "D{% for m in messages %}[{{ m.content }}]\r\n{% endfor %}\r|";
    const pre = tokenizerDir("jinja-crlf", undefined, { "chat_template.jinja": crlf, "additional_chat_templates/tool_use.jinja": crlf });
    expect(pre.renderChat(messages)).toBe("D[hi]\n|");
    expect(pre.renderChat(messages, { tools })).toBe("D[hi]\n|");
    expect(tokenizerDir("config-crlf", crlf).renderChat(messages)).toBe("D[hi]\n|");
  });

  test("the config's named templates: tool_use for a request with tools, default without", () => {
    const pre = tokenizerDir("config-named", [{ name: "default", template: DEFAULT }, { name: "tool_use", template: TOOL_USE }]);
    expect(pre.renderChat(messages)).toBe("D[hi]");
    expect(pre.renderChat(messages, { tools })).toBe("T1(hi)");
    // tools: [] reaches the template as a list, not None, so it picks as a request with tools.
    expect(pre.renderChat(messages, { tools: [] })).toBe("T0(hi)");
    // Ids too: the rendering the request got is the one tokenized.
    expect(pre.decode(pre.encodeChat(messages, { tools }))).toBe("T1(hi)");
  });

  test("chat_template.jinja with additional_chat_templates/ replace the config's templates, by file name", () => {
    const pre = tokenizerDir("template-files", [{ name: "default", template: "C" }, { name: "tool_use", template: "CT" }], {
      "chat_template.jinja": DEFAULT,
      "additional_chat_templates/tool_use.jinja": TOOL_USE,
    });
    expect(pre.renderChat(messages)).toBe("D[hi]");
    expect(pre.renderChat(messages, { tools })).toBe("T1(hi)");
  });

  test("named templates without a tool_use give a request with tools the default; without a default, no template", () => {
    expect(tokenizerDir("default-only", [{ name: "default", template: DEFAULT }]).renderChat(messages, { tools })).toBe("D[hi]");
    const toolsOnly = tokenizerDir("tool-use-only", [{ name: "tool_use", template: TOOL_USE }]);
    expect(toolsOnly.renderChat(messages, { tools })).toBe("T1(hi)");
    expect(() => toolsOnly.renderChat(messages)).toThrow(ChatTemplateError);
  });

  test("without a template in the tokenizer's files, a processor's chat_template.json; no processor, no template", () => {
    const pre = tokenizerDir("processor-json", undefined, { "chat_template.json": JSON.stringify({ chat_template: DEFAULT }), ...IMAGE_PROCESSOR });
    expect(pre.renderChat(messages)).toBe("D[hi]");
    // transformers' tokenizer does not read chat_template.json, and without its image half there is no processor.
    expect(() => tokenizerDir("processor-json-alone", undefined, { "chat_template.json": JSON.stringify({ chat_template: DEFAULT }) }).renderChat(messages)).toThrow(ChatTemplateError);
  });

  test("a chat_template_kwargs' tools pick the template as the request's would: tool_use", () => {
    const pre = tokenizerDir("kwargs-tools", [{ name: "default", template: DEFAULT }, { name: "tool_use", template: TOOL_USE }]);
    expect(pre.renderChat(messages, { templateKwargs: { tools } })).toBe("T1(hi)");
    expect(pre.renderChat(messages, { templateKwargs: { tools: [] } })).toBe("T0(hi)");
    expect(pre.renderChat(messages, { tools, templateKwargs: { tools: null } })).toBe("T1(hi)");
  });
});

describe("a multimodal processor's own template (resolve_chat_template: before the tokenizer's for a chat without tools)", () => {
  const PROCESSOR = "P{% for m in messages %}{% for p in m.content %}<{{ p.text }}>{% endfor %}{% endfor %}";

  test("chat_template.json renders a chat without tools, with its own content format; a chat with tools gets the tokenizer's", () => {
    const pre = tokenizerDir("processor-first", DEFAULT, { "chat_template.json": JSON.stringify({ chat_template: PROCESSOR }), ...IMAGE_PROCESSOR });
    expect(pre.renderChat(messages)).toBe("P<hi>");
    expect(pre.renderChat(messages, { tools })).toBe("D[hi]");
    // An empty list is tools all the same (not None); the kwargs' tools too.
    expect(pre.renderChat(messages, { tools: [] })).toBe("D[hi]");
    expect(pre.renderChat(messages, { templateKwargs: { tools } })).toBe("D[hi]");
    expect(pre.decode(pre.encodeChat(messages))).toBe("P<hi>");
    // --chat-template wins over it.
    const flagged = tokenizerDir("processor-flag", DEFAULT, { "chat_template.json": JSON.stringify({ chat_template: PROCESSOR }), ...IMAGE_PROCESSOR }, { chatTemplate: "F{{ messages[0].content }}" });
    expect(flagged.renderChat(messages)).toBe("Fhi");
  });

  test("it wins over chat_template.jinja too; processor_config.json's counts only without either file", () => {
    const json = JSON.stringify({ chat_template: PROCESSOR });
    expect(tokenizerDir("processor-over-jinja", undefined, { "chat_template.json": json, "chat_template.jinja": DEFAULT, ...IMAGE_PROCESSOR }).renderChat(messages)).toBe("P<hi>");
    expect(tokenizerDir("processor-config", DEFAULT, { "processor_config.json": json }).renderChat(messages)).toBe("P<hi>");
    expect(tokenizerDir("processor-config-jinja", undefined, { "processor_config.json": json, "chat_template.jinja": DEFAULT }).renderChat(messages)).toBe("D[hi]");
    // Beside additional_chat_templates/ the legacy file makes transformers refuse the processor: the tokenizer's render.
    const conflict = tokenizerDir("processor-conflict", undefined, { "chat_template.json": json, "chat_template.jinja": DEFAULT, "additional_chat_templates/tool_use.jinja": TOOL_USE, ...IMAGE_PROCESSOR });
    expect(conflict.renderChat(messages)).toBe("D[hi]");
  });

  test("only a directory with a processor's image, video or audio half has a processor: else the tokenizer's template renders", () => {
    const json = JSON.stringify({ chat_template: PROCESSOR });
    expect(tokenizerDir("no-processor", DEFAULT, { "chat_template.json": json }).renderChat(messages)).toBe("D[hi]");
    expect(tokenizerDir("video-processor", DEFAULT, { "chat_template.json": json, "video_preprocessor_config.json": "{}" }).renderChat(messages)).toBe("P<hi>");
  });
});

describe("a request's chat_template naming one of the tokenizer's templates (resolve_chat_template asks get_chat_template)", () => {
  const named = [{ name: "default", template: DEFAULT }, { name: "tool_use", template: TOOL_USE }];

  test("a name renders that template, with its content format; other text is the template itself", () => {
    const pre = tokenizerDir("request-named", named, {}, { trustRequestChatTemplate: true });
    expect(pre.renderChat(messages, { chatTemplate: "tool_use", tools })).toBe("T1(hi)");
    expect(pre.renderChat(messages, { tools, chatTemplate: "default" })).toBe("D[hi]");
    expect(pre.renderChat(messages, { templateKwargs: { chat_template: "tool_use" }, tools })).toBe("T1(hi)");
    expect(pre.renderChat(messages, { chatTemplate: "default2" })).toBe("default2");
    // A single template has no names: the value is the template's text.
    expect(tokenizerDir("request-unnamed", DEFAULT, {}, { trustRequestChatTemplate: true }).renderChat(messages, { chatTemplate: "tool_use" })).toBe("tool_use");
    // A name is still the request's template: refused without --trust-request-chat-template.
    expect(() => tokenizerDir("request-named-untrusted", named).renderChat(messages, { chatTemplate: "tool_use" })).toThrow(ChatTemplateError);
  });
});

describe("vLLM's renderers other than its Jinja one: the chat is unrenderable here (routed by load)", () => {
  const config = (c: Record<string, unknown>) => ({ "config.json": JSON.stringify(c) });
  const unrendered = (pre: Preprocessor) => {
    let err: unknown;
    try {
      pre.renderChat(messages);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ChatUnrenderable);
    expect((err as ChatUnrenderable).reason).toBe("template_engine");
    return (err as Error).message;
  };

  test("gpt-oss (config.json's model_type) goes through Harmony, whatever the tokenizer mode", () => {
    expect(unrendered(tokenizerDir("gpt-oss", DEFAULT, config({ model_type: "gpt_oss" })))).toContain("Harmony");
    expect(unrendered(tokenizerDir("gpt-oss-hf", DEFAULT, config({ model_type: "gpt_oss" }), { tokenizerMode: "hf" }))).toContain("Harmony");
    expect(tokenizerDir("qwen3-config", DEFAULT, config({ model_type: "qwen3", architectures: ["Qwen3ForCausalLM"] })).renderChat(messages)).toBe("D[hi]");
    // SGLang's rules render it (their own guards apply), the vLLM flag ignored.
    expect(tokenizerDir("sglang-gpt-oss", DEFAULT, config({ model_type: "gpt_oss" }), { chatRendering: "sglang", tokenizerMode: "mistral" }).renderChat(messages)).toBe("D[hi]");
  });

  test("a --tokenizer-mode with a renderer of its own; hf and slow render the template", () => {
    expect(unrendered(tokenizerDir("mode-mistral", DEFAULT, {}, { tokenizerMode: "mistral" }))).toContain('"mistral"');
    expect(unrendered(tokenizerDir("mode-deepseek", DEFAULT, {}, { tokenizerMode: "deepseek_v32" }))).toContain("deepseek_v32");
    for (const mode of ["hf", "slow", "auto"]) expect(tokenizerDir(`mode-${mode}`, DEFAULT, {}, { tokenizerMode: mode }).renderChat(messages)).toBe("D[hi]");
  });

  test("under auto: the architectures given a mode of their own, and Mistral's tokenizer files; an explicit hf renders them", () => {
    expect(unrendered(tokenizerDir("auto-v32", DEFAULT, config({ model_type: "deepseek_v32", architectures: ["DeepseekV32ForCausalLM"] })))).toContain("deepseek_v32");
    expect(unrendered(tokenizerDir("auto-grok", DEFAULT, config({ architectures: ["Grok1ForCausalLM"] })))).toContain("grok2");
    expect(unrendered(tokenizerDir("auto-kimi-audio", DEFAULT, config({ architectures: ["MoonshotKimiaForCausalLM"] })))).toContain("kimi_audio");
    expect(unrendered(tokenizerDir("auto-qwen-vl", DEFAULT, config({ architectures: ["QwenVLForConditionalGeneration"] })))).toContain("qwen_vl");
    expect(unrendered(tokenizerDir("auto-tekken", DEFAULT, { "tekken.json": "{}" }))).toContain("Mistral");
    expect(unrendered(tokenizerDir("auto-sentencepiece", DEFAULT, { "tokenizer.model.v3": "" }))).toContain("Mistral");
    expect(tokenizerDir("hf-tekken", DEFAULT, { "tekken.json": "{}" }, { tokenizerMode: "hf" }).renderChat(messages)).toBe("D[hi]");
  });

  test("Mistral's tokenizer files count anywhere under the directory, as vLLM lists a local model's files; a directory so named does not", () => {
    expect(unrendered(tokenizerDir("auto-tekken-nested", DEFAULT, { "mistral/tekken.json": "{}" }))).toContain("Mistral");
    expect(unrendered(tokenizerDir("auto-sentencepiece-nested", DEFAULT, { "a/b/tokenizer.model.v7": "" }))).toContain("Mistral");
    expect(tokenizerDir("tekken-dir", DEFAULT, { "tekken.json/x": "" }).renderChat(messages)).toBe("D[hi]");
  });

  test("the same is told once for the startup warning, from the directory and the flags", () => {
    tokenizerDir("told-gpt-oss", DEFAULT, config({ model_type: "gpt_oss" }));
    expect(servedVllmRenderer({ tokenizerDir: join(root, "told-gpt-oss") })).toContain("Harmony");
    expect(servedVllmRenderer({ tokenizerDir: join(root, "told-gpt-oss"), chatRendering: "sglang" })).toBeNull();
    expect(servedVllmRenderer({ tokenizerDir: source })).toBeNull();
    expect(servedVllmRenderer({ tokenizerDir: source, tokenizerMode: "mistral" })).toContain('"mistral"');
    expect(servedVllmRenderer({ tokenizerMode: "mistral" })).toBeNull();
  });

  test("the directory is read for it once: the startup warning tells what the preprocessor read", () => {
    tokenizerDir("told-once", DEFAULT, config({ model_type: "gpt_oss" }));
    writeFileSync(join(root, "told-once", "config.json"), JSON.stringify({ model_type: "qwen3" }));
    expect(servedVllmRenderer({ tokenizerDir: join(root, "told-once") })).toContain("Harmony");
  });
});
