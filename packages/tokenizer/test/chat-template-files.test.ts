// Which chat template a tokenizer directory gives a request, as transformers loads it (tokenizer from_pretrained) and
// picks it (get_chat_template, which vLLM calls with the request's tools). Each case is a directory of Qwen3's
// tokenizer.json with template files and a config written for it.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ChatTemplateError } from "../src/messages";
import { createPreprocessor, type Preprocessor } from "../src/index";
import { qwen3TokenizerDir } from "./qwen3-fixture";

// The default renders the content as a string; the tool-use template loops over the content's parts, so a request
// with tools also gets that template's content format (vLLM's, detected on the template it resolved).
const DEFAULT = "D{% for m in messages %}[{{ m.content }}]{% endfor %}";
const TOOL_USE = "T{{ tools | length }}{% for m in messages %}{% for p in m.content %}({{ p.text }}){% endfor %}{% endfor %}";
const messages = [{ role: "user", content: "hi" }];
const tools = [{ type: "function", function: { name: "f" } }];

let root: string;
let source: string;
beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), "chat-template-files-"));
  source = await qwen3TokenizerDir();
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** A tokenizer dir: Qwen3's tokenizer.json and config, the config's chat_template replaced, plus `files`. */
function tokenizerDir(name: string, chatTemplate: unknown, files: Record<string, string> = {}): Preprocessor {
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
  return createPreprocessor({ tokenizerDir: dir, cache: false });
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

  test("without a template in the tokenizer's files, a processor's chat_template.json", () => {
    const pre = tokenizerDir("processor-json", undefined, { "chat_template.json": JSON.stringify({ chat_template: DEFAULT }) });
    expect(pre.renderChat(messages)).toBe("D[hi]");
  });
});
