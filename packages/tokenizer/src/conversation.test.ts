import { describe, expect, test } from "bun:test";
import { conversation } from "./conversation";

// vLLM's _strip_claude_code_billing_header (vllm/renderers/chat_utils/parse_chat_message_content.py), applied to
// system messages before their parts are parsed; the expected contents are what that code leaves, by hand.
describe("a system message's leading x-anthropic-billing-header line is dropped, as vLLM drops it", () => {
  const header = "x-anthropic-billing-header: cc_version=2.1.77.abc; cc_entrypoint=cli; cch=9f3e1;";
  const system = (content: unknown) => [{ role: "system", content } as never];
  const contentOf = (content: unknown, format: "string" | "openai" = "string") => conversation(system(content), format)[0]!.content;

  test("a text keeps what follows the header's line; a text that is only the header goes", () => {
    expect(contentOf(`${header}\nYou are a coding agent.\nBe brief.`)).toBe("You are a coding agent.\nBe brief.");
    expect(contentOf(header)).toBe("");
    expect(contentOf(`${header}\n`)).toBe("");
    expect(contentOf(header, "openai")).toEqual([]);
  });

  test("each text part is stripped on its own, strings and parts of type text alike", () => {
    const parts = [{ type: "text", text: header }, { type: "text", text: "You are a coding agent." }];
    expect(contentOf(parts)).toBe("You are a coding agent.");
    expect(contentOf(parts, "openai")).toEqual([{ type: "text", text: "You are a coding agent." }]);
    expect(contentOf([`${header}\nA`, "B"])).toBe("A\nB");
  });

  test("only a system message, only at a text's start, only parts of type text", () => {
    expect(conversation([{ role: "user", content: `${header}\nq` }], "string")[0]!.content).toBe(`${header}\nq`);
    expect(contentOf(` ${header}\nA`)).toBe(` ${header}\nA`);
    expect(contentOf([{ type: "input_text", text: `${header}\nA` }])).toBe(`${header}\nA`);
  });
});
