import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { writeFileSync } from "node:fs";
import { tempDir } from "@kv-epp/testkit";
import { join } from "node:path";
import { byteFallbackDecode, byteFallbackEncode, byteFallbackRenderChat, createPreprocessor } from "../src/index";
import { continueFinalMessage } from "../src/messages";

describe("byte-level fallback", () => {
  test("without a tokenizer dir the preprocessor says it is the byte fallback", () => {
    expect(createPreprocessor().kind).toBe("byte-fallback");
    expect(createPreprocessor({}).cacheStats().hits).toBe(0);
  });

  test("text becomes one id per UTF-8 byte, and decodes back", () => {
    expect([...byteFallbackEncode("aé🙂")]).toEqual([0x61, 0xc3, 0xa9, 0xf0, 0x9f, 0x99, 0x82]);
    fc.assert(fc.property(fc.string({ unit: "grapheme" }), (s) => {
      const ids = createPreprocessor().encodeCompletion(s);
      expect(ids).toEqual(byteFallbackEncode(s));
      expect(byteFallbackDecode(ids)).toBe(s);
    }));
  });

  test("continue_final_message: the rendering stops right after the final message's text", () => {
    const messages = [{ role: "user", content: "q" }, { role: "assistant", content: "The answer is" }];
    expect(byteFallbackRenderChat(messages, { addGenerationPrompt: false, continueFinalMessage: true })).toBe(
      "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nThe answer is",
    );
  });

  test("continueFinalMessage cuts as transformers does: last occurrence, kept or trimmed trailing whitespace", () => {
    const m = (content: string) => [{ role: "assistant", content }];
    expect(continueFinalMessage("<a>x</a><a>x</a>", m("x"))).toBe("<a>x</a><a>x");
    // the template trimmed the message: cut after the stripped text
    expect(continueFinalMessage("<a>hello</a>", m("  hello \n"))).toBe("<a>hello");
    // the template kept the trailing space: cut after it
    expect(continueFinalMessage("<a>end </a>", m("end "))).toBe("<a>end ");
    // leading whitespace in the message: the kept slice never equals it, so the stripped length decides
    expect(continueFinalMessage("<a> Hello </a>", m(" Hello "))).toBe("<a> Hello");
    expect(() => continueFinalMessage("<a>bye</a>", m("hello"))).toThrow(/final message does not appear/);
  });

  test("token-id prompts are used as given", () => {
    expect([...createPreprocessor().encodeCompletion([300, 7, 151644])]).toEqual([300, 7, 151644]);
  });

  test("a chat extended by more turns keeps the ids of the earlier turns as a prefix", () => {
    const msg = fc.record({ role: fc.constantFrom("system", "user", "assistant"), content: fc.string() });
    fc.assert(fc.property(fc.array(msg, { minLength: 1 }), fc.array(msg, { minLength: 1 }), (a, b) => {
      const pre = createPreprocessor();
      const head = pre.encodeChat(a);
      const whole = pre.encodeChat([...a, ...b]);
      // Everything but the trailing generation prompt of the shorter chat is a prefix of the longer one.
      const prompt = byteFallbackEncode("<|im_start|>assistant\n").length;
      expect(whole.subarray(0, head.length - prompt)).toEqual(head.subarray(0, head.length - prompt));
    }));
  });

  test("tools change the ids", () => {
    const pre = createPreprocessor();
    const msgs = [{ role: "user", content: "hi" }];
    expect(pre.encodeChat(msgs, { tools: [{ type: "function" }] })).not.toEqual(pre.encodeChat(msgs));
  });
});

describe("tokenizer dir", () => {
  test("a dir without tokenizer.json fails at creation, naming the file", () => {
    const dir = tempDir("no-tokenizer-");
    writeFileSync(join(dir, "tokenizer_config.json"), "{}");
    expect(() => createPreprocessor({ tokenizerDir: dir })).toThrow(/tokenizer\.json not found/);
  });
});
