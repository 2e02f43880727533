import { pyStrip } from "./py-values";
import type { ChatMessage } from "./types";

// vLLM's "string" content format: the text parts of a multi-part content joined with "\n"; non-text parts
// (images, audio) contribute nothing to the text a text-only tokenizer sees.
export function messageText(m: ChatMessage): string {
  const c = m.content;
  if (c === undefined || c === null) return "";
  if (typeof c === "string") return c;
  return c.filter((p) => p.type === "text" && typeof p.text === "string").map((p) => p.text as string).join("\n");
}

/** A chat the request's input cannot render (the template raised, or continue_final_message cannot apply): a 400, as vLLM answers. */
export class ChatTemplateError extends Error {
  override name = "ChatTemplateError";
}

/**
 * A chat this process cannot render as vLLM would, through no fault of the request: the template engine here
 * failed where the template did not raise (`template_engine`: a gap in @huggingface/jinja, not one in the request),
 * or the render passed its bound on work (`render_bound`: see RenderBound in py-template.ts). vLLM may serve it, so
 * it is routed by load rather than refused (see encodeJob).
 */
export class ChatUnrenderable extends Error {
  override name = "ChatUnrenderable";

  constructor(
    message: string,
    readonly reason: "template_engine" | "render_bound" = "template_engine",
  ) {
    super(message);
  }
}

/**
 * `tools` as vLLM passes them to the template (ChatCompletionToolsParam.model_dump): `{type, function: {name,
 * description, parameters, strict, defer_loading}, defer_loading}` in that order, description and parameters as null
 * when absent, strict and defer_loading only when set (a tool's defer_loading also reaches its function), fields
 * vLLM does not know dropped. Templates print each tool with tojson, so OpenAI SDK clients' `strict: true` is in
 * every prompt. Numbers inside keep their PyFloat marks.
 */
export function templateTools(tools: readonly unknown[]): unknown[] {
  return tools.map((t) => {
    const tool = (t ?? {}) as { type?: unknown; function?: FunctionFields; defer_loading?: unknown };
    const fn: FunctionFields = tool.function ?? {};
    const out: Record<string, unknown> = { type: tool.type ?? "function", function: functionDefinition(fn, tool.defer_loading) };
    if (isSet(tool.defer_loading)) out.defer_loading = tool.defer_loading;
    return out;
  });
}

type FunctionFields = { name?: unknown; description?: unknown; parameters?: unknown; strict?: unknown; defer_loading?: unknown };

const isSet = (v: unknown) => v !== undefined && v !== null;

/** vLLM's FunctionDefinition as dumped: its unset strict and defer_loading left out. */
function functionDefinition(fn: FunctionFields, toolDeferLoading: unknown): Record<string, unknown> {
  const out: Record<string, unknown> = { name: fn.name, description: fn.description ?? null, parameters: fn.parameters ?? null };
  if (isSet(fn.strict)) out.strict = fn.strict;
  const deferLoading = isSet(fn.defer_loading) ? fn.defer_loading : toolDeferLoading;
  if (isSet(deferLoading)) out.defer_loading = deferLoading;
  return out;
}

/** The text continue_final_message continues: the content, or its last part that has text (transformers' rule). */
function finalText(m: ChatMessage): string {
  const c = m.content;
  if (!Array.isArray(c)) return messageText(m);
  const part = c.findLast((p) => typeof p.text === "string");
  if (part === undefined) throw new ChatTemplateError("continue_final_message is set but the final message has no text to continue");
  return part.text as string;
}

/**
 * continue_final_message as transformers' apply_chat_template does it: find the last occurrence of the
 * final message's text stripped; cut after the text as written when the template kept it (leading
 * whitespace aside), else after the stripped text (the template trimmed trailing whitespace).
 */
export function continueFinalMessage(rendered: string, messages: readonly ChatMessage[]): string {
  const last = messages.at(-1);
  if (last === undefined) return rendered;
  const text = finalText(last);
  const stripped = pyStrip(text, null, "both");
  const at = rendered.lastIndexOf(stripped);
  if (at < 0) throw new ChatTemplateError("continue_final_message is set but the final message does not appear in the rendered chat");
  const kept = pyStrip(text, null, "left").length;
  return rendered.slice(0, rendered.slice(at, at + kept) === text ? at + kept : at + stripped.length);
}
